"""The APP of a taskq worker that runs Django tasks:

    DJANGO_SETTINGS_MODULE=mysite.settings taskq worker taskq.contrib.django.worker:actors
    python manage.py taskq_worker [--workers N] [taskq worker flags]     # the same, from manage.py

Importing this module sets Django up (`django.setup()`) when it is not yet: every process that loads the
APP (each worker, and each worker `taskq run` forks) has Django ready before a task runs. Each task runs
in a worker thread (`isolation="thread"`: Django's ORM is sync), with `close_old_connections()` before and
after it as Django does around a request, and Django's `task_started` / `task_finished` signals.

`actors` knows the tasks of every installed app's `tasks` module at start (the worker counts their jobs on
its thread capacity, `max_threads`), and resolves any other task of a TaskqBackend by its module path the first
time one of its jobs is claimed, when that module belongs to an installed app or is already imported
(a job's actor name never makes the worker import an arbitrary module).

Each task's actor is bound to the queues its backend accepts (`QUEUES`, as Django checks them at
enqueue; every queue when `QUEUES` is empty) and to the task's own `queue_name`: a job of the task found
in any other queue fails as ActorQueueMismatch without running, so that who may enqueue into one queue
cannot start the tasks of another.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import threading
from typing import Any

import django
from django.apps import apps

if not apps.ready:
    django.setup()

from django.db import close_old_connections
from django.utils.module_loading import import_string

from taskq.actors.declaration import Actor, ActorRegistry, actor
from taskq.actors.thread import stand_in_error
from taskq.context import JobContext
from taskq.contrib.django._compat import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from taskq.contrib.django.backend import TaskqBackend, error_message

TaskCall = dict[str, Any]
"""A Django task's job payload: {"args": [...], "kwargs": {...}}, the JSON-normalised arguments of its
`.enqueue()` call."""

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}"


def run_task(payload: TaskCall, ctx: JobContext[TaskCall]) -> Any:
    """The body of every Django task's actor: the task named by the actor, called as Django would."""
    task = task_named(ctx.actor_name)
    args: list[Any] = list(payload.get("args") or [])
    kwargs: dict[str, Any] = dict(payload.get("kwargs") or {})
    result = TaskResult(
        task=task, id=str(ctx.job_id), status=TaskResultStatus.RUNNING, enqueued_at=None, started_at=None,
        finished_at=None, last_attempted_at=None, args=args, kwargs=kwargs,
        backend=task.backend, errors=[], worker_ids=[WORKER_ID] * ctx.attempt,
    )
    close_old_connections()
    task_started.send(sender=TaskqBackend, task_result=result)
    try:
        if task.takes_context:
            value = task.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)
    except Exception as exc:
        message = error_message(exc)
        cls = type(exc)
        object.__setattr__(result, "status", TaskResultStatus.FAILED)
        result.errors.append(TaskError(exception_class_path=f"{cls.__module__}.{cls.__qualname__}",
                                       traceback=message.partition("\n")[2]))
        task_finished.send(sender=TaskqBackend, task_result=result)
        # the same class name on the job (error_class), the class path and traceback in its error_message
        raise stand_in_error(cls.__name__, message) from exc
    finally:
        close_old_connections()
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "_return_value", value)
    task_finished.send(sender=TaskqBackend, task_result=result)
    return value


_tasks: dict[str, Task] = {}


def task_named(module_path: str) -> Task:
    found = _tasks.get(module_path)
    if found is None:
        value = import_string(module_path)
        if not isinstance(value, Task):
            raise LookupError(f"{module_path!r} is not a Django task")
        found = _tasks[module_path] = value
    return found


def runs_on_taskq(task: Task) -> bool:
    try:
        return isinstance(task.get_backend(), TaskqBackend)
    except Exception:
        return False


def task_queues(task: Task) -> list[str]:
    """The queues a task's jobs may run on: its backend's `QUEUES` (every queue when empty, as Django
    allows) and the task's own `queue_name`."""
    try:
        configured = set(task.get_backend().queues)
    except Exception:
        configured = set()
    if not configured:
        return ["*"]
    return sorted(configured | {task.queue_name})


def resolvable(module_path: str) -> bool:
    """True when a job's actor name may be looked up: its module belongs to an installed app, or is
    already imported. Anything else would make the worker import a module a job names."""
    module = module_path.rpartition(".")[0]
    if not module:
        return False
    if module in sys.modules:
        return True
    return any(module == config.name or module.startswith(config.name + ".") for config in apps.get_app_configs())


class DjangoTaskRegistry(ActorRegistry):
    """Actors for Django tasks: one per task, named by its module path, all running `run_task`."""

    def __init__(self) -> None:
        super().__init__(owner="taskq.contrib.django")
        self._lock = threading.Lock()

    def add_task(self, task: Task) -> Actor[Any, Any]:
        with self._lock:
            existing = super().get(task.module_path)
            if existing is not None:
                return existing
            _tasks[task.module_path] = task
            return actor(name=task.module_path, queue=task.queue_name, queues=task_queues(task),
                         isolation="thread", max_attempts=1, registry=self)(run_task)

    def get(self, name: str) -> Actor[Any, Any] | None:
        found = super().get(name)
        if found is not None:
            return found
        if not resolvable(name):
            return None
        try:
            value = import_string(name)
        except ImportError:
            return None
        if isinstance(value, Task) and runs_on_taskq(value):
            return self.add_task(value)
        return None

    def autodiscover(self) -> DjangoTaskRegistry:
        """Register the TaskqBackend tasks of each installed app's `tasks` module."""
        for config in apps.get_app_configs():
            name = f"{config.name}.tasks"
            try:
                module = importlib.import_module(name)
            except ModuleNotFoundError as exc:
                if exc.name == name:
                    continue
                raise
            for value in vars(module).values():
                if isinstance(value, Task) and runs_on_taskq(value):
                    self.add_task(value)
        return self


actors = DjangoTaskRegistry().autodiscover()
