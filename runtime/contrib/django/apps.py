"""The Django app `taskq.contrib.django` (in INSTALLED_APPS for the `taskq_worker` management command)."""

from __future__ import annotations

from django.apps import AppConfig


class TaskqConfig(AppConfig):
    name = "taskq.contrib.django"
    label = "taskq"
    verbose_name = "taskq"
