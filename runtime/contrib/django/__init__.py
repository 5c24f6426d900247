"""taskq for Django (extra `taskq[django]`): a backend for Django's Tasks framework, enqueue in Django's
own transaction, and a worker entry with Django set up in every process. See docs/integrations.md.

- `TASKS = {"default": {"BACKEND": "taskq.contrib.django.TaskqBackend", "OPTIONS": {...}}}`;
- `client.enqueue(..., connection=taskq.contrib.django.psycopg_connection("default"))` with any taskq
  client (SyncJobsClient) inside `transaction.atomic()`: the job commits or rolls back with the block;
- `python manage.py taskq_worker` (with "taskq.contrib.django" in INSTALLED_APPS), or
  `taskq worker taskq.contrib.django.worker:actors` with DJANGO_SETTINGS_MODULE set.

Importing this package imports nothing of Django's Tasks framework until a name is used (Django loads it
while reading INSTALLED_APPS)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.contrib.django.backend import TaskqBackend, psycopg_connection

__all__ = ["TaskqBackend", "psycopg_connection"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from taskq.contrib.django import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
