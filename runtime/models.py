"""Value types shared by the client, the worker and the CLI. Imports nothing heavy."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, StringConstraints, field_serializer, model_validator


class JobStatus(enum.StrEnum):
    PENDING = "pending"
    SCHEDULED = "scheduled"
    RUNNING = "running"
    AWAITING_PARENTS = "awaiting_parents"
    """Waiting for its parents (enqueued with depends_on); never claimed until they settle."""
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    CRASHED = "crashed"
    ABANDONED = "abandoned"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: frozenset[JobStatus] = frozenset(
    {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.CRASHED, JobStatus.ABANDONED}
)
UNFINISHED_STATUSES: frozenset[JobStatus] = frozenset(set(JobStatus) - TERMINAL_STATUSES)
# statuses for which JobHandle.wait() raises JobFailed
FAILURE_STATUSES: frozenset[JobStatus] = TERMINAL_STATUSES - {JobStatus.SUCCEEDED}


class CancelPhase(enum.IntEnum):
    """Where a running job is on the cancellation ladder (spec §3). ABANDON_PENDING is never persisted."""

    NONE = 0
    COOPERATIVE = 1
    FORCED = 2
    ABANDON_PENDING = 3


class CancelOrigin(enum.StrEnum):
    """Why a job's cancel_event was set: an operator's request, or infrastructure (spec §4)."""

    OPERATOR = "operator"
    SHUTDOWN = "shutdown"
    TIMEOUT = "timeout"
    LEASE_LOST = "lease_lost"


class CancelMarker(enum.StrEnum):
    """error_class values stamped by the cancel paths (spec §8)."""

    COOPERATIVE = "CancelledCooperatively"
    FORCED = "CancelledForced"
    ABANDONED = "CancelAbandoned"
    BEFORE_START = "CancelledBeforeStart"


_frozen = ConfigDict(frozen=True, extra="forbid")


NO_TIMEOUT = datetime(9999, 12, 31, tzinfo=UTC)
"""The wake-up of a wait for a signal without timeout, as taskq.jobs.scheduled_at and job_steps.wake_at store it
(a date Python can read; sql/0017_durable_jobs.sql)."""


@dataclass(frozen=True, slots=True)
class Suspension:
    """A suspended job: `kind` 'sleep' or 'signal', the `signal` name it waits for, `until` its wake-up (None: a
    wait without timeout)."""

    kind: str
    signal: str | None
    until: datetime | None


class JobRow(BaseModel):
    """One row of taskq.jobs, as read. `result` is the stored JSON; decode it with the actor's type."""

    model_config = _frozen

    id: UUID
    actor: str
    queue: str
    payload: Any
    result: Any = None
    status: JobStatus
    priority: int
    tags: tuple[str, ...]
    attempt: int
    max_attempts: int
    claim_epoch: int
    interrupt_count: int
    scheduled_at: datetime
    schedule_to_close: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None
    lock_expires_at: datetime | None
    cancel_phase: int
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    error_class: str | None
    error_message: str | None
    progress: Any = None
    parent_id: UUID | None
    unique_key: str | None = None
    unique_scope: str | None = None
    requeue_count: int = 0
    snooze_count: int = 0
    """Times the actor raised taskq.Snooze; each gave its attempt back to the budget (max_attempts + 1)."""
    idempotent: bool = True
    """False for a job of an `@actor(idempotent=False)`: a crash or lost lease ends it crashed, never retried."""
    schedule: str | None = None
    """The schedule that made this job, if one did."""
    scheduled_for: datetime | None = None
    """Its nominal slot time (a trigger's own instant)."""
    revision: int = 1
    """Rises with every change to the row (status, cancel phase, progress, requeue); never with a heartbeat."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context (traceparent, tracestate) the job was enqueued in, when OpenTelemetry traced
    the enqueue (taskq.contrib.otel)."""
    has_dependents: bool = False
    """Some job was enqueued with this one in its depends_on."""
    parents_remaining: int = 0
    """While awaiting_parents: the parents not yet terminal."""
    dependency_mode: str | None = None
    """'on_success' or 'on_any_terminal' for a job enqueued with depends_on; None otherwise."""
    concurrency_key: str | None = None
    """The key of per-key concurrency limits (`concurrency_key=` at enqueue), if any."""
    fairness_key: str | None = None
    """The key its queue shares starts by (`fairness_key=` at enqueue; None: the empty key)."""
    fair_tag: float | None = None
    """Its place among the ready jobs of its queue and priority when the queue shares by key (claims take
    the smallest first); None in a queue without fair share, infinite until a job written to start later
    is due."""

    workflow_id: UUID | None = None
    """The workflow the job belongs to (`JobsClient.workflow()`, and children its members enqueue)."""
    wait_kind: str | None = None
    """While scheduled: 'sleep' (ctx.sleep) or 'signal' (ctx.wait_for_signal) when the job is suspended,
    until scheduled_at (9999-12-31: a wait without timeout). Meaningless in any other status."""
    wait_signal: str | None = None
    """The signal name a job suspended in ctx.wait_for_signal waits for."""

    @field_serializer("fair_tag", when_used="json")
    def _finite_tag(self, tag: float | None) -> float | None:
        # JSON has no infinity: a job not yet tagged (due later) shows null
        return tag if tag is not None and math.isfinite(tag) else None

    @property
    def is_terminal(self) -> bool:
        return self.status.is_terminal

    @property
    def suspension(self) -> Suspension | None:
        """What the job sleeps or waits for while suspended (ctx.sleep, ctx.wait_for_signal); None otherwise."""
        if self.status != JobStatus.SCHEDULED or self.wait_kind is None:
            return None
        return Suspension(self.wait_kind, self.wait_signal,
                          None if self.scheduled_at >= NO_TIMEOUT else self.scheduled_at)


class EventKind(enum.StrEnum):
    """The kinds of a job's timeline entries (`JobEvent.kind`; the CHECK list of taskq.job_events.kind)."""

    STATE_CHANGE = "state_change"
    """The row moved from one status to another (`from_status`, `to_status`)."""
    CANCEL_REQUESTED = "cancel_requested"
    PROGRESS = "progress"
    NOTE = "note"
    SNOOZED = "snoozed"
    REQUEUED = "requeued"
    OPERATOR = "operator"
    """The web API's audit entry on the job's timeline (who did what; any state change is its own entry)."""
    STEP = "step"
    """A step's result was stored (`detail.step`: its name)."""
    SIGNAL = "signal"
    """A signal was sent to the job (`detail.signal`, `detail.woke`: it was waiting for it)."""
    SLEEPING = "sleeping"
    """The attempt ended in a durable sleep (`detail.until`)."""
    WAITING = "waiting"
    """The attempt ended waiting for a signal (`detail.signal`, `detail.until`)."""


class JobEvent(BaseModel):
    model_config = _frozen

    id: int
    job_id: UUID
    at: datetime
    kind: str
    from_status: str | None
    to_status: str | None
    attempt: int | None
    worker_id: str | None
    detail: dict[str, Any]


class JobAttempt(BaseModel):
    model_config = _frozen

    job_id: UUID
    attempt: int
    claim_epoch: int
    worker_id: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error_class: str | None
    error_message: str | None


class CancelResult(BaseModel):
    """What `JobsClient.cancel()` did (spec §7)."""

    model_config = _frozen

    job_id: UUID
    previous_status: JobStatus
    new_status: JobStatus
    cancellation_initiated: bool


class BulkCancelResult(BaseModel):
    """What `JobsClient.cancel_where()` did: counts by the status each job had, and the ids it touched."""

    model_config = _frozen

    by_previous_status: dict[JobStatus, int]
    job_ids: tuple[UUID, ...]
    batches: int

    @property
    def total(self) -> int:
        return sum(self.by_previous_status.values())

    @property
    def cancelled_before_start(self) -> int:
        """Pending and scheduled jobs moved straight to cancelled."""
        return self.by_previous_status.get(JobStatus.PENDING, 0) + self.by_previous_status.get(
            JobStatus.SCHEDULED, 0
        )

    @property
    def running_requested(self) -> int:
        """Running jobs that now carry a cooperative cancel request (cancel_phase 1)."""
        return self.by_previous_status.get(JobStatus.RUNNING, 0)


class WorkflowCancelResult(BaseModel):
    """What `JobsClient.cancel_workflow()` did to the workflow's members, all counted in one statement:

    - `cancelled`: members that were waiting (pending; scheduled, sleeping or waiting for a signal included;
      awaiting_parents) and ended cancelled at once (error_class CancelledBeforeStart);
    - `suspended`: how many of those were sleeping or waiting for a signal (a part of `cancelled`);
    - `cancel_requested`: running members now asked to stop (cancel_phase 1): their workers take them down
      the ladder (cooperative, then forced, then abandoned), so they end later;
    - `already_cancelling`: running members with a cancel already in flight, left as they were;
    - `already_ended`: members that had already ended (any terminal status);
    - `members`: every job carrying the workflow id (the sum of the four counts other than `suspended`).

    `job_ids` are the members this call changed (cancelled or asked to stop)."""

    model_config = _frozen

    workflow_id: UUID
    members: int
    cancelled: int
    suspended: int
    cancel_requested: int
    already_cancelling: int
    already_ended: int
    job_ids: tuple[UUID, ...]


# statuses an operator may requeue from: the failure endings (a deploy may have fixed the cause)
REQUEUEABLE_STATUSES: frozenset[JobStatus] = frozenset({JobStatus.FAILED, JobStatus.CRASHED, JobStatus.ABANDONED})
UNIQUE_SCOPES: tuple[str, ...] = ("active", "retained")


class RequeueResult(BaseModel):
    """What `JobsClient.requeue()` did. `requeued` is False when the job was not in a failure status
    (nothing changed) or when another job holds its unique key (`conflict_job_id` names that job)."""

    model_config = _frozen

    job_id: UUID
    previous_status: JobStatus
    new_status: JobStatus
    requeued: bool
    conflict_job_id: UUID | None = None
    revived: tuple[UUID, ...] = ()
    """With cascade=True: the dependents brought back to awaiting_parents."""


class BulkRequeueResult(BaseModel):
    """What `JobsClient.requeue_where()` did: requeued jobs counted by the status each had, the ids it
    requeued, and the failed jobs left alone because another job holds their unique key."""

    model_config = _frozen

    by_previous_status: dict[JobStatus, int]
    job_ids: tuple[UUID, ...]
    conflicts: dict[UUID, UUID] = {}
    """Job left unchanged -> the job that holds its unique key."""
    batches: int
    revived: tuple[UUID, ...] = ()
    """With cascade=True: the dependents brought back to awaiting_parents."""

    @property
    def total(self) -> int:
        return sum(self.by_previous_status.values())

class PruneClass(enum.StrEnum):
    """A retention class: terminal statuses pruned on one keep window (job_attempts rows are their own)."""

    SUCCEEDED = "succeeded"
    """succeeded and cancelled jobs, after `retention_succeeded`"""
    FAILED = "failed"
    """failed, crashed and abandoned jobs, after `retention_failed`"""
    ATTEMPTS = "attempts"
    """finished job_attempts rows, after `retention_attempts`"""
    RECEIPTS = "receipts"
    """the web API's idempotency receipts (taskq.operator_requests), after `retention_receipts`"""
    AUDIT = "audit"
    """the web API's operator audit rows (taskq.operator_audit), after `retention_audit`"""


class PruneResult(BaseModel):
    """What one prune deleted (or, with `dry_run`, would delete now): jobs per retention class, the
    events deleted with them, attempts rows, and the web API's idempotency receipts and audit rows."""

    model_config = _frozen

    succeeded: int = 0
    """succeeded + cancelled jobs"""
    failed: int = 0
    """failed + crashed + abandoned jobs"""
    attempts: int = 0
    receipts: int = 0
    """idempotency receipts (taskq.operator_requests)"""
    audit: int = 0
    """operator audit rows (taskq.operator_audit)"""
    events: int = 0
    dry_run: bool = False
    batches: int = 0
    seconds: float = 0.0

    @property
    def total(self) -> int:
        """Rows of jobs, attempts, receipts and audit (events not counted)."""
        return self.succeeded + self.failed + self.attempts + self.receipts + self.audit


NonEmptyStr = Annotated[str, StringConstraints(min_length=1, max_length=255)]


class JobFilter(BaseModel):
    """Selects jobs: every given criterion must hold. `tags` means all of them; `unfinished` limits to
    pending, scheduled, awaiting_parents and running; `workflow_id` to one workflow's members; `waiting` to
    the jobs sleeping or waiting for a signal (those are 'scheduled'). An empty filter matches everything,
    so bulk cancels refuse it."""

    model_config = _frozen

    ids: tuple[UUID, ...] | None = None
    actors: tuple[NonEmptyStr, ...] | None = None
    queues: tuple[NonEmptyStr, ...] | None = None
    statuses: tuple[JobStatus, ...] | None = None
    tags: tuple[NonEmptyStr, ...] | None = None
    unfinished: bool = False
    created_before: datetime | None = None
    created_after: datetime | None = None
    workflow_id: UUID | None = None
    """The members of one workflow (`Workflow.id`: the jobs `client.workflow()` wrote and their children)."""
    waiting: Literal["sleep", "signal", "any"] | None = None
    """Jobs suspended by `ctx.sleep` ('sleep'), by `ctx.wait_for_signal` ('signal'), or by either ('any')."""

    @model_validator(mode="after")
    def _check(self) -> JobFilter:
        for name in ("ids", "actors", "queues", "statuses", "tags"):
            value = getattr(self, name)
            if value is not None and len(value) == 0:
                raise ValueError(f"{name} must not be an empty list (leave it out to match any)")
        for name in ("created_before", "created_after"):
            value = getattr(self, name)
            if value is not None and value.tzinfo is None:
                raise ValueError(f"{name} must be timezone-aware")
        if self.created_before and self.created_after and self.created_after >= self.created_before:
            raise ValueError("created_after must be earlier than created_before")
        if self.unfinished and self.statuses and not (set(self.statuses) & UNFINISHED_STATUSES):
            raise ValueError("unfinished=True with only terminal statuses matches nothing")
        if self.waiting is not None and self.statuses and JobStatus.SCHEDULED not in self.statuses:
            raise ValueError("waiting matches scheduled jobs only: add 'scheduled' to statuses or leave them out")
        return self

    @property
    def is_empty(self) -> bool:
        return self == JobFilter()

    def status_list(self) -> list[str] | None:
        """The statuses to match, after applying `unfinished`; None means any."""
        wanted: set[JobStatus] | None = set(self.statuses) if self.statuses else None
        if self.unfinished:
            wanted = (wanted or set(JobStatus)) & UNFINISHED_STATUSES
        return sorted(wanted) if wanted is not None else None


class ScheduleInfo(BaseModel):
    """One row of taskq.schedules as `taskq schedules` shows it. `last_outcome` is the scheduler's last
    verdict (enqueued, triggered, skipped_overlap, missed); `last_job_status` that job's status now."""

    model_config = _frozen

    name: str
    actor: str
    queue: str
    cron: str | None
    every_seconds: int | None
    timezone: str
    misfire: str
    overlap: str
    enabled: bool
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    next_run_at: datetime
    last_run_at: datetime | None
    last_job_id: UUID | None
    last_outcome: str | None
    last_job_status: JobStatus | None
    missed_total: int
    owner: str
    updated_at: datetime


class SchedulePauseResult(BaseModel):
    """What a pause or resume did: `changed` is False when the schedule already was in that state."""

    model_config = _frozen

    name: str
    paused: bool
    changed: bool


class ScheduleTriggerResult(BaseModel):
    """The job `trigger` made, outside the slot sequence; `scheduled_for` is the trigger's instant."""

    model_config = _frozen

    name: str
    job_id: UUID
    scheduled_for: datetime


class QueueLimits(BaseModel):
    """The fleet-wide limits of a queue or of an actor; None: no such limit. `rate_limit` job starts per
    `rate_period` seconds (both or neither)."""

    model_config = _frozen

    concurrency: int | None = None
    concurrency_per_key: int | None = None
    rate_limit: int | None = None
    rate_period: float | None = None

    @property
    def any(self) -> bool:
        return self.concurrency is not None or self.concurrency_per_key is not None or self.rate_limit is not None

    def describe(self) -> str:
        """`concurrency 5, 2 per key, 100 per 60s`, or `-` without limits."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.concurrency_per_key is not None:
            parts.append(f"{self.concurrency_per_key} per key")
        if self.rate_limit is not None and self.rate_period is not None:
            parts.append(f"{self.rate_limit} per {self.rate_period:g}s")
        return ", ".join(parts) or "-"


class QueueStats(BaseModel):
    """One queue as `taskq queues` shows it. `pending` counts the jobs due now (whatever their status,
    pending or a retry whose delay passed), `scheduled` those due later; `failed_last_hour` the jobs that
    ended failed, crashed or abandoned in the last hour; `throughput` jobs finished per second over the
    last 5 minutes; `oldest_pending_age` seconds since the oldest due job became due (None: none due)."""

    model_config = _frozen

    name: str
    pending: int
    scheduled: int
    running: int
    awaiting_parents: int
    failed_last_hour: int
    oldest_pending_age: float | None
    throughput: float
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    pause_reason: str | None
    limits: QueueLimits
    fairness_weights: dict[str, float] = {}
    """The queue's fairness weights other than the default 1, by key ('' = jobs without a key)."""


class ActorLimitsInfo(BaseModel):
    """The limits an actor's code declares (`@actor(global_concurrency=...)`), as the workers wrote them."""

    model_config = _frozen

    actor: str
    limits: QueueLimits
    running: int
    declared_by: str | None
    updated_at: datetime


class QueueStatsReport(BaseModel):
    """`client.queue_stats()`: every known queue (a row in taskq.queues, or unfinished jobs), by name, and
    the actor limits in force."""

    model_config = _frozen

    queues: tuple[QueueStats, ...]
    actor_limits: tuple[ActorLimitsInfo, ...]

    def queue(self, name: str) -> QueueStats:
        for q in self.queues:
            if q.name == name:
                return q
        raise KeyError(name)


class QueuePauseResult(BaseModel):
    """What a pause or resume did: `changed` is False when the queue already was in that state."""

    model_config = _frozen

    name: str
    paused: bool
    changed: bool


class FairnessWeightResult(BaseModel):
    """What `set_fairness_weight` did: the key's weight before and now (1 is the default), and how many of
    the key's ready jobs were re-spaced by the new weight."""

    model_config = _frozen

    queue: str
    key: str
    weight: float
    previous: float
    retagged: int

    @property
    def changed(self) -> bool:
        return self.weight != self.previous


class FairKeyStats(BaseModel):
    """One fairness key of a queue ('' = jobs without a key), as `taskq queues --keys` shows it: its ready
    jobs (due now), those scheduled for later, running, started in the last minute, and its weight."""

    model_config = _frozen

    key: str
    ready: int
    scheduled: int
    running: int
    started_last_minute: int
    weight: float


class QueueLimitsResult(BaseModel):
    """A queue's limits after `set_queue_limits`."""

    model_config = _frozen

    name: str
    limits: QueueLimits
