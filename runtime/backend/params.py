"""What the backend's job statements take and give back: checked enqueue options, one job or a batch
to insert, a requeue, and a row just inserted. Plain data, no connection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic_core import from_json

from taskq.models import JobFilter, JobRow, JobStatus

# a unique enqueue whose holder ended between the insert and the lookup tries again; each round needs
# a holder to finish within one round trip, so a few tries are plenty
UNIQUE_INSERT_TRIES = 5


@dataclass(frozen=True, slots=True)
class JobOptions:
    """The checked options of one enqueue call: everything but the id and the payload."""

    actor: str
    queue: str
    priority: int
    tags: tuple[str, ...]
    max_attempts: int
    scheduled_at: datetime | None
    schedule_to_close: float | None
    parent_id: UUID | None = None
    idempotent: bool = True
    trace_context: str | None = None
    """JSON text of the W3C trace context of the enqueue (taskq.tracing), or None."""
    concurrency_key: str | None = None
    fairness_key: str | None = None
    """The key its queue shares starts by (None: the empty key); one for all the jobs of a batch unless
    the batch gives one per job (JobBatch.fairness_keys)."""
    workflow_id: UUID | None = None
    """The workflow the job belongs to (JobsClient.workflow(), or inherited by a child of a member)."""

    def params(self) -> dict[str, Any]:
        return {
            "idempotent": self.idempotent,
            "concurrency_key": self.concurrency_key,
            "fairness_key": self.fairness_key,
            "actor": self.actor,
            "queue": self.queue,
            "priority": self.priority,
            "tags": list(self.tags),
            "max_attempts": self.max_attempts,
            "scheduled_at": self.scheduled_at,
            "schedule_to_close": self.schedule_to_close,
            "parent_id": self.parent_id,
            "workflow_id": self.workflow_id,
            "trace_context": self.trace_context,
        }


@dataclass(frozen=True, slots=True)
class JobInsert:
    """One job to write: the payload is already validated and encoded as JSON text. With `unique_key`,
    the write is skipped when another job holds the key (`unique_scope`: 'active' or 'retained')."""

    id: UUID
    payload_json: str
    options: JobOptions
    unique_key: str | None = None
    unique_scope: str | None = None

    def params(self) -> dict[str, Any]:
        return self.options.params() | {"id": self.id, "payload": self.payload_json, "notify": True}


@dataclass(frozen=True, slots=True)
class JobBatch:
    """Jobs that share every option and differ only in id and payload (one `enqueue_many` call).
    `unique_keys`, when given, has one key (or None) per job, all of scope `unique_scope`."""

    ids: list[UUID]
    payloads_json: list[str]
    options: JobOptions
    unique_keys: list[str | None] | None = None
    unique_scope: str | None = None
    fairness_keys: list[str | None] | None = None
    """One fairness key (or None) per job; None: `options.fairness_key` for every job."""

    def params(self) -> dict[str, Any]:
        keys = self.fairness_keys
        if keys is None and self.options.fairness_key is not None:
            keys = [self.options.fairness_key] * len(self.ids)
        return self.options.params() | {
            "ids": self.ids, "payloads": self.payloads_json, "notify": True,
            "fairness_keys": keys, "fairness_ranks": None if keys is None else fairness_ranks(keys),
        }


def fairness_ranks(keys: list[str | None]) -> list[int]:
    """Each job's place (from 1) among the jobs of the same key in its batch: the key's jobs are spaced
    from where that key starts (sql/0016_fair_claims.sql)."""
    seen: dict[str | None, int] = {}
    ranks = []
    for key in keys:
        seen[key] = rank = seen.get(key, 0) + 1
        ranks.append(rank)
    return ranks


@dataclass(frozen=True, slots=True)
class RequeueParams:
    """An operator's requeue: the reason for the timeline, and the new budget. `attempts` None means the
    actor's max_attempts when it is one of `actor_max_attempts` (the caller's registry), else the job's own."""

    reason: str | None
    attempts: int | None
    actor_max_attempts: dict[str, int]
    reset_steps: bool = False
    """Forget the steps, sleeps and waits earlier attempts stored: the rerun starts over."""

    def params(self) -> dict[str, Any]:
        return {
            "reset_steps": self.reset_steps,
            "reason": self.reason,
            "attempts": self.attempts,
            "actor_names": list(self.actor_max_attempts),
            "actor_max_attempts": list(self.actor_max_attempts.values()),
        }


@dataclass(frozen=True, slots=True)
class RequeueRow:
    """What a requeue statement did to one job."""

    job_id: UUID
    previous_status: JobStatus
    requeued: bool
    conflict_job_id: UUID | None
    revived: tuple[UUID, ...] = ()


def filter_params(flt: JobFilter) -> dict[str, Any]:
    return {
        "ids": list(flt.ids) if flt.ids else None,
        "actors": list(flt.actors) if flt.actors else None,
        "queues": list(flt.queues) if flt.queues else None,
        "statuses": flt.status_list(),
        "tags": list(flt.tags) if flt.tags else None,
        "created_before": flt.created_before,
        "created_after": flt.created_after,
        "workflow_id": flt.workflow_id,
        "waiting": flt.waiting,
    }


@dataclass(frozen=True, slots=True)
class InsertedJob:
    """A row just inserted: what we sent plus the columns the server computed. `row()` builds the
    JobRow (without reading the table back; checked against get() in tests). One difference: jsonb keeps
    numbers as numeric, so a float too large to be an exact integer (1e300) reads back from the table
    as an int, while this row keeps the float that was sent."""

    job: JobInsert
    status: str
    scheduled_at: datetime
    schedule_to_close: datetime | None
    created_at: datetime
    holder: JobRow | None = None
    """For a unique enqueue that wrote nothing: the job that holds the key."""

    @property
    def created(self) -> bool:
        return self.holder is None

    @property
    def job_id(self) -> UUID:
        return self.job.id if self.holder is None else self.holder.id

    def row(self) -> JobRow:
        if self.holder is not None:
            return self.holder
        job = self.job
        opts = job.options
        return JobRow.model_validate(  # faster than model_construct, and checked
            dict(
                id=job.id,
                actor=opts.actor,
                queue=opts.queue,
                payload=from_json(job.payload_json),  # 4x faster than json.loads, same values
                result=None,
                status=JobStatus(self.status),
                priority=opts.priority,
                tags=opts.tags,
                attempt=0,
                max_attempts=opts.max_attempts,
                claim_epoch=0,
                interrupt_count=0,
                scheduled_at=self.scheduled_at,
                schedule_to_close=self.schedule_to_close,
                created_at=self.created_at,
                started_at=None,
                finished_at=None,
                worker_id=None,
                lock_expires_at=None,
                cancel_phase=0,
                cancel_requested_at=None,
                cancel_reason=None,
                error_class=None,
                error_message=None,
                progress=None,
                parent_id=opts.parent_id,
                unique_key=job.unique_key,
                unique_scope=job.unique_scope,
                requeue_count=0,
                snooze_count=0,
                idempotent=opts.idempotent,
                revision=1,
                trace_context=from_json(opts.trace_context) if opts.trace_context is not None else None,
                concurrency_key=opts.concurrency_key,
                fairness_key=opts.fairness_key,
                workflow_id=opts.workflow_id,
            )
        )


def row_to_job(row: dict[str, Any]) -> JobRow:
    row.pop("_n", None)
    return JobRow.model_validate(row)

