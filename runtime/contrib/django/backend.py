"""`TaskqBackend`: Django's Tasks framework (`django.tasks`, or the django-tasks backport) on taskq.

    TASKS = {"default": {"BACKEND": "taskq.contrib.django.TaskqBackend", "OPTIONS": {...}}}

A `@task` function's `.enqueue()` writes a taskq job named after the task's module path, payload
`{"args": [...], "kwargs": {...}}`. When taskq's tables live in the database of the `DATABASE` alias (the
default: the DSN is built from that alias), the job is inserted on Django's own connection, inside the
current `transaction.atomic()` block: it commits or rolls back with it, with no on_commit gap.

OPTIONS (all optional):
- `DATABASE`: the Django alias whose transaction an enqueue joins ("default"); None: never join, each
  enqueue commits at once on taskq's own pool;
- `DSN`: where taskq's tables are (default: built from the `DATABASE` alias's settings);
- `MAX_ATTEMPTS`: attempts per task (1: Django's model has no retries; a failure is FAILED at once);
- `TRANSACTION_POOLER`: the DSN goes through PgBouncer in transaction mode.

What Django asks for and taskq cannot honour is refused by `validate_task` or documented in
docs/integrations.md: `async def` tasks (`supports_async_task` False: a worker thread runs the task with
Django's sync ORM); a task result's `errors` keep the exception's class path and traceback only as far as
taskq's error_message (4000 characters) holds them.
"""

from __future__ import annotations

import threading
import traceback
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connections
from psycopg import Connection
from psycopg.conninfo import make_conninfo

from taskq.client_sync import SyncJobsClient
from taskq.contrib.django._compat import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from taskq.exceptions import ConfigurationError, PayloadInvalid
from taskq.models import JobRow, JobStatus

STATUS = {
    JobStatus.PENDING: TaskResultStatus.READY,
    JobStatus.SCHEDULED: TaskResultStatus.READY,
    JobStatus.RUNNING: TaskResultStatus.RUNNING,
    JobStatus.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    JobStatus.FAILED: TaskResultStatus.FAILED,
    JobStatus.CANCELLED: TaskResultStatus.FAILED,
    JobStatus.CRASHED: TaskResultStatus.FAILED,
    JobStatus.ABANDONED: TaskResultStatus.FAILED,
}
"""taskq's eight statuses compressed onto Django's four (DEP 14: a backend with more statuses compresses
them). A job waiting for its retry is READY again."""

_NOT_LIBPQ = frozenset({"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory", "context"})


def dsn_of(alias: str) -> str:
    """A libpq DSN for a Django database alias (its NAME, USER, PASSWORD, HOST, PORT and libpq OPTIONS)."""
    conn = connections[alias]
    if conn.vendor != "postgresql":
        raise ConfigurationError(f"Django database {alias!r} is {conn.vendor}, not PostgreSQL: taskq needs PostgreSQL")
    s = conn.settings_dict
    params: dict[str, Any] = {"dbname": s.get("NAME"), "user": s.get("USER"), "password": s.get("PASSWORD"),
                              "host": s.get("HOST"), "port": s.get("PORT")}
    params |= {k: v for k, v in (s.get("OPTIONS") or {}).items()
               if k not in _NOT_LIBPQ and isinstance(v, str | int) and not isinstance(v, bool)}
    return make_conninfo("", **{k: v for k, v in params.items() if v not in (None, "")})


def psycopg_connection(alias: str = "default") -> Connection[Any]:
    """The psycopg 3 connection under Django's connection `alias`, connected if it was not, for
    `enqueue(..., connection=...)`: inside `transaction.atomic()` it is in Django's transaction."""
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    conn = connections[alias]
    if conn.vendor != "postgresql" or not is_psycopg3:
        raise ConfigurationError(f"Django database {alias!r} must be PostgreSQL through psycopg 3 to take taskq jobs")
    conn.ensure_connection()
    raw = conn.connection
    assert isinstance(raw, Connection)
    return raw


def job_to_result(task: Task, row: JobRow, worker_ids: list[str], alias: str) -> TaskResult:
    status = STATUS[row.status]
    errors: list[TaskError] = []
    if status == TaskResultStatus.FAILED:
        errors.append(task_error(row))
    payload = row.payload if isinstance(row.payload, dict) else {}
    result = TaskResult(
        task=task, id=str(row.id), status=status, enqueued_at=row.created_at, started_at=row.started_at,
        finished_at=row.finished_at, last_attempted_at=row.started_at, args=payload.get("args", []),
        kwargs=payload.get("kwargs", {}), backend=alias, errors=errors, worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", row.result)
    return result


def task_error(row: JobRow) -> TaskError:
    """The worker writes a Django task's failure as `module.Class: message` and its traceback (see
    taskq.contrib.django.worker); any other end (cancelled, crashed, abandoned, an unknown task) is
    reported as taskq.exceptions.JobFailed with the row's marker and message."""
    message = row.error_message or ""
    head, _, rest = message.partition("\n")
    path = head.partition(": ")[0]
    if row.status is JobStatus.FAILED and row.error_class and path.endswith("." + row.error_class):
        return TaskError(exception_class_path=path, traceback=rest or head)
    return TaskError(exception_class_path="taskq.exceptions.JobFailed",
                     traceback=f"job {row.id} ended {row.status.value}: {row.error_class or ''} {message}".strip())


def error_message(exc: BaseException) -> str:
    """How a Django task's exception is written to the job (read back by `task_error`)."""
    cls = type(exc)
    return f"{cls.__module__}.{cls.__qualname__}: {exc}\n" + "".join(traceback.format_exception(exc))


class TaskqBackend(BaseTaskBackend):
    supports_defer = True
    supports_async_task = False
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        options = dict(self.options)
        unknown = set(options) - {"DATABASE", "DSN", "MAX_ATTEMPTS", "TRANSACTION_POOLER"}
        if unknown:
            raise ConfigurationError(f"TASKS[{alias!r}] OPTIONS: unknown {sorted(unknown)} for TaskqBackend")
        self.database: str | None = options.get("DATABASE", "default")
        self.dsn: str | None = options.get("DSN")
        attempts = options.get("MAX_ATTEMPTS", 1)
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(f"TASKS[{alias!r}] OPTIONS MAX_ATTEMPTS must be an int >= 1, got {attempts!r}")
        self.max_attempts = attempts
        self.transaction_pooler = bool(options.get("TRANSACTION_POOLER", False))
        self._client: SyncJobsClient | None = None
        self._lock = threading.Lock()

    @property
    def client(self) -> SyncJobsClient:
        """taskq's client, connected at the first use (SchemaNotReady, naming `taskq migrate`, if the
        database has no taskq schema)."""
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    dsn = self.dsn or dsn_of(self.database or "default")
                    self._client = SyncJobsClient.connect(dsn, transaction_pooler=self.transaction_pooler)
                client = self._client
        return client

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        payload = {"args": _json(task, args, list), "kwargs": _json(task, kwargs, dict)}
        run_after: datetime | None = task.run_after
        connection = psycopg_connection(self.database) if self.database is not None else None
        handle = self.client.enqueue(
            task.module_path, payload, queue=task.queue_name, priority=-task.priority, scheduled_at=run_after,
            max_attempts=self.max_attempts, connection=connection,
        )
        row = handle.row
        assert row is not None
        result = job_to_result(task, row, [], self.alias)
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        handle = self.client.get(job_id)
        if handle is None or handle.row is None:
            raise TaskResultDoesNotExist(result_id)
        row = handle.row
        workers = [a.worker_id for a in self.client.attempts(job_id) if a.worker_id]
        return job_to_result(task_of(row), row, workers, self.alias)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def task_of(row: JobRow) -> Task:
    """The Django task a job runs, with the queue, priority and run_after it was enqueued with."""
    from django.utils.module_loading import import_string

    try:
        found = import_string(row.actor)
    except ImportError:
        found = None
    if not isinstance(found, Task):
        raise TaskResultDoesNotExist(f"job {row.id} is not a Django task ({row.actor!r} is no task here)")
    changes: dict[str, Any] = {"queue_name": row.queue, "priority": max(-100, min(100, -row.priority))}
    if row.scheduled_at > row.created_at:
        changes["run_after"] = row.scheduled_at
    return found.using(**changes)


def _json(task: Task, value: Any, kind: type) -> Any:
    try:
        normal = normalize_json(value)
    except (TypeError, ValueError) as exc:
        raise PayloadInvalid(
            f"the arguments of Django task {task.module_path!r} are not JSON-serialisable ({exc}); nothing was "
            "written"
        ) from None
    return normal if isinstance(normal, kind) else kind(normal)
