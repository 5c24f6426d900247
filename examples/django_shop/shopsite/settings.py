"""Settings of the example project: one PostgreSQL database (env SHOP_DSN, a libpq DSN), which also
holds taskq's tables (`taskq migrate --dsn "$SHOP_DSN"`), so an enqueue joins Django's transaction."""

import os

import django
from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ.get("SHOP_DSN", "dbname=shop"))

SECRET_KEY = "example-only"
USE_TZ = True
INSTALLED_APPS = ["taskq.contrib.django", "orders"]
if django.VERSION < (6, 0):
    INSTALLED_APPS.append("django_tasks")  # Django 5.2: the backport of django.tasks
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "shop"),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
    }
}
TASKS = {"default": {"BACKEND": "taskq.contrib.django.TaskqBackend", "QUEUES": ["default", "mail"]}}
