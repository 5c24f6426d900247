"""taskq: a PostgreSQL-backed job queue and multiprocess worker runtime.

Importing taskq opens no connection, starts no thread, forks nothing and imports none of taskq's parts:
each public name is imported from its module when first used (PEP 562). So a producer that writes
`from taskq import actor` loads the actor declaration only, not the clients, the backend, psycopg_pool or
prometheus_client; `from taskq import JobsClient` loads the client and what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.actors.declaration import Actor, ActorRegistry, RetryPolicy, actor
    from taskq.client import JobHandle, JobsClient
    from taskq.client_sync import SyncJobHandle, SyncJobsClient
    from taskq.context import JobContext
    from taskq.exceptions import (
        JobFailed,
        JobNotFound,
        LeaseLost,
        NonRetryableError,
        SignalInvalid,
        SignalRefused,
        SignalTimeout,
        SleepInvalid,
        Snooze,
        SnoozeInvalid,
        StepInvalid,
        TaskqError,
        TransactionInvalid,
        WorkflowNotFound,
    )
    from taskq.models import (
        BulkCancelResult,
        BulkRequeueResult,
        CancelOrigin,
        CancelPhase,
        CancelResult,
        JobFilter,
        JobRow,
        JobStatus,
        RequeueResult,
        WorkflowCancelResult,
    )
    from taskq.schedules import Schedule
    from taskq.settings import WorkerSettings

__version__ = "0.1.0"

_HOMES: dict[str, str] = {
    "Actor": "taskq.actors.declaration",
    "ActorRegistry": "taskq.actors.declaration",
    "RetryPolicy": "taskq.actors.declaration",
    "actor": "taskq.actors.declaration",
    "JobHandle": "taskq.client",
    "JobsClient": "taskq.client",
    "SyncJobHandle": "taskq.client_sync",
    "SyncJobsClient": "taskq.client_sync",
    "JobContext": "taskq.context",
    "JobFailed": "taskq.exceptions",
    "NonRetryableError": "taskq.exceptions",
    "JobNotFound": "taskq.exceptions",
    "LeaseLost": "taskq.exceptions",
    "SignalInvalid": "taskq.exceptions",
    "SignalRefused": "taskq.exceptions",
    "SignalTimeout": "taskq.exceptions",
    "SleepInvalid": "taskq.exceptions",
    "StepInvalid": "taskq.exceptions",
    "TransactionInvalid": "taskq.exceptions",
    "WorkflowNotFound": "taskq.exceptions",
    "Snooze": "taskq.exceptions",
    "SnoozeInvalid": "taskq.exceptions",
    "TaskqError": "taskq.exceptions",
    "BulkCancelResult": "taskq.models",
    "BulkRequeueResult": "taskq.models",
    "CancelOrigin": "taskq.models",
    "CancelPhase": "taskq.models",
    "CancelResult": "taskq.models",
    "JobFilter": "taskq.models",
    "JobRow": "taskq.models",
    "JobStatus": "taskq.models",
    "RequeueResult": "taskq.models",
    "WorkflowCancelResult": "taskq.models",
    "Schedule": "taskq.schedules",
    "WorkerSettings": "taskq.settings",
}
"""Each public name and the module that defines it."""

__all__ = [
    "Actor",
    "ActorRegistry",
    "BulkCancelResult",
    "BulkRequeueResult",
    "CancelOrigin",
    "CancelPhase",
    "CancelResult",
    "JobContext",
    "JobFailed",
    "JobFilter",
    "JobHandle",
    "JobNotFound",
    "JobRow",
    "JobStatus",
    "JobsClient",
    "LeaseLost",
    "NonRetryableError",
    "RequeueResult",
    "RetryPolicy",
    "Schedule",
    "SignalInvalid",
    "SignalRefused",
    "SignalTimeout",
    "SleepInvalid",
    "Snooze",
    "SnoozeInvalid",
    "StepInvalid",
    "SyncJobHandle",
    "SyncJobsClient",
    "TaskqError",
    "TransactionInvalid",
    "WorkerSettings",
    "WorkflowCancelResult",
    "WorkflowNotFound",
    "actor",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        # AttributeError, not ImportError: `from taskq import sql` then imports the submodule
        raise AttributeError(f"module 'taskq' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later uses find it without calling this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
