"""taskq: a PostgreSQL-backed job queue and multiprocess worker runtime.

Importing taskq opens no connection, starts no thread and forks nothing.
"""

from __future__ import annotations

from taskq.actors.declaration import Actor, ActorRegistry, RetryPolicy, actor
from taskq.client import JobHandle, JobsClient
from taskq.client_sync import SyncJobHandle, SyncJobsClient
from taskq.context import JobContext
from taskq.exceptions import JobFailed, NonRetryableError, Snooze, SnoozeInvalid, TaskqError
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
)
from taskq.schedules import Schedule
from taskq.settings import WorkerSettings

__version__ = "0.1.0"

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
    "JobRow",
    "JobStatus",
    "JobsClient",
    "NonRetryableError",
    "RequeueResult",
    "RetryPolicy",
    "Schedule",
    "Snooze",
    "SnoozeInvalid",
    "SyncJobHandle",
    "SyncJobsClient",
    "TaskqError",
    "WorkerSettings",
    "actor",
]
