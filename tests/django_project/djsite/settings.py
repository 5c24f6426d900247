"""Settings of the Django project the integration tests run (tests/integration/test_django_tasks.py).
The database is the test's own: env TASKQ_DJANGO_DSN (and TASKQ_DJANGO_EMPTY_DSN, a database without
taskq's schema, for the `nodb` backend)."""

from __future__ import annotations

import os

import django
from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["TASKQ_DJANGO_DSN"])

SECRET_KEY = "taskq-tests-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["taskq.contrib.django", "shop"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # the backport of django.tasks for Django 5.2
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
    }
}
TASKS = {
    "default": {"BACKEND": "taskq.contrib.django.TaskqBackend", "QUEUES": ["default", "other"]},
    "nodb": {
        "BACKEND": "taskq.contrib.django.TaskqBackend",
        "OPTIONS": {"DSN": os.environ.get("TASKQ_DJANGO_EMPTY_DSN", ""), "DATABASE": None},
    },
}
