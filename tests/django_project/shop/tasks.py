"""The project's Django tasks (found by taskq.contrib.django.worker's autodiscovery)."""

from __future__ import annotations

from typing import Any

try:
    from django.tasks import TaskContext, task
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import TaskContext, task  # type: ignore[no-redef]


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def fail(message: str) -> None:
    raise LookupError(message)


@task(takes_context=True)
def with_context(context: TaskContext, tag: str) -> dict[str, Any]:
    return {"attempt": context.attempt, "id": context.task_result.id, "tag": tag}


@task(backend="nodb")
def elsewhere() -> None:
    return None
