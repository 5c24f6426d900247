"""Operator actions on jobs: cancel and requeue, one by id or in bulk by filter.

Each action is one service function over a Backend. The async client, the CLI (through the client),
and the sync client and web API to come all call these, so the checks, the results and the SQL are
the same whatever the face.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from uuid import UUID

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend, RequeueParams
from taskq.checks import as_job_id, as_workflow_id, check_reason
from taskq.exceptions import ConfigurationError, WorkflowNotFound
from taskq.metrics import cancellation_requested
from taskq.models import (
    BulkCancelResult,
    BulkRequeueResult,
    CancelResult,
    JobFilter,
    JobStatus,
    RequeueResult,
    WorkflowCancelResult,
)

MAX_REQUEUE_ATTEMPTS = 1_000_000

Progress = Callable[[int], None]
"""Called after each committed batch of a bulk action with the number of jobs handled so far."""


def check_batch_size(batch_size: int) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
        raise ConfigurationError(f"batch_size must be between 1 and 100000, got {batch_size!r}")
    return batch_size


def check_filter(flt: JobFilter, action: str, hint: str) -> JobFilter:
    if not isinstance(flt, JobFilter):
        raise ConfigurationError(f"{action}_where needs a JobFilter, got {flt!r}")
    if flt.is_empty:
        raise ConfigurationError(f"refusing to {action} with an empty filter; {hint}")
    return flt


# -- cancel -----------------------------------------------------------------------------------------


async def cancel_job(backend: Backend, job_id: UUID | str, reason: str | None = None) -> CancelResult:
    """Request cancellation (spec §2): pending/scheduled jobs end cancelled at once; a running job gets a
    cooperative request its worker acts on. KeyError if the job does not exist."""
    cancellation_requested()
    jid = as_job_id(job_id)
    reason = check_reason(reason)
    before = await backend.get(jid)
    if before is None:
        raise KeyError(jid)
    changed = await backend.write_cancel_request(jid, reason)
    after = await backend.get(jid)
    assert after is not None  # jobs rows are never deleted while a client reads them
    return CancelResult(
        job_id=jid,
        previous_status=before.status,
        new_status=after.status,
        cancellation_initiated=changed is not None,
    )


async def cancel_jobs_where(
    backend: Backend, flt: JobFilter, reason: str | None = None, *, batch_size: int = 1000
) -> BulkCancelResult:
    """Cancel every matching unfinished job, in committed batches of `batch_size`. An empty filter is
    refused: say `JobFilter(unfinished=True)` to mean every job."""
    check_filter(flt, "cancel", "use JobFilter(unfinished=True) for all")
    check_batch_size(batch_size)
    return await backend.cancel_where(flt, check_reason(reason), batch_size=batch_size)


async def cancel_workflow(backend: Backend, workflow_id: UUID | str, reason: str | None = None
                          ) -> WorkflowCancelResult:
    """Cancel every member of the workflow that has not ended, in one statement: waiting members
    (sleeping and signal-waiting ones included) end cancelled at once, running ones get the operator's
    cancel request and go down the ladder on their workers. Each changed member's event carries the
    workflow id; its cancel_reason is `reason`, or 'workflow-cancel:<id>' without one. ConfigurationError for
    an id that is not a UUID, WorkflowNotFound when no job carries it."""
    wid = as_workflow_id(workflow_id)
    reason = check_reason(reason)
    result = await backend.cancel_workflow(wid, reason)
    if result is None:
        raise WorkflowNotFound(f"no job belongs to workflow {wid}")
    if result.job_ids:
        cancellation_requested()
    return result


# -- requeue ----------------------------------------------------------------------------------------


def requeue_params(reason: str | None, attempts: int | None, registry: ActorRegistry,
                   reset_steps: bool = False) -> RequeueParams:
    """The checked reason and budget. Without `attempts`, each job gets its actor's max_attempts when
    the actor is registered in this process, else its own max_attempts again."""
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_REQUEUE_ATTEMPTS
    ):
        shown = attempts if not isinstance(attempts, float) or math.isfinite(attempts) else str(attempts)
        raise ConfigurationError(f"attempts must be an int between 1 and {MAX_REQUEUE_ATTEMPTS:,}, got {shown!r}")
    return RequeueParams(
        reason=check_reason(reason),
        attempts=attempts,
        actor_max_attempts={a.name: a.max_attempts for a in registry},
        reset_steps=_check_flag(reset_steps, "reset_steps"),
    )


async def requeue_job(
    backend: Backend,
    job_id: UUID | str,
    *,
    reason: str | None = None,
    attempts: int | None = None,
    registry: ActorRegistry,
    cascade: bool = False,
    reset_steps: bool = False,
) -> RequeueResult:
    """Put a failed, crashed or abandoned job back to pending, due now, with `attempts` more attempts.
    `attempt` and `claim_epoch` are kept (never lowered), so no earlier attempt can write over the rerun.
    From any other status nothing changes (`requeued` False). If another job holds the job's unique key,
    nothing changes and `conflict_job_id` names it. KeyError if the job does not exist. `cascade`: in the
    same transaction, the jobs the dependency cascade cancelled because of it (ParentFailed, and theirs
    down the graph) go back to awaiting_parents (`revived`). `reset_steps`: the steps, sleeps and waits its
    earlier attempts stored are forgotten, so the rerun starts over (by default they are kept)."""
    jid = as_job_id(job_id)
    params = requeue_params(reason, attempts, registry, reset_steps)
    done = await backend.job_requeue(jid, params, cascade=_check_cascade(cascade))
    if done is None:
        raise KeyError(jid)
    return RequeueResult(
        job_id=jid,
        previous_status=done.previous_status,
        new_status=JobStatus.PENDING if done.requeued else done.previous_status,
        requeued=done.requeued,
        conflict_job_id=done.conflict_job_id,
        revived=done.revived,
    )


async def requeue_jobs_where(
    backend: Backend,
    flt: JobFilter,
    *,
    reason: str | None = None,
    attempts: int | None = None,
    registry: ActorRegistry,
    batch_size: int = 1000,
    progress: Progress | None = None,
    cascade: bool = False,
    reset_steps: bool = False,
) -> BulkRequeueResult:
    """`requeue_job` for every matching failed, crashed or abandoned job, in committed batches of
    `batch_size` in id order. Jobs whose unique key another job holds are left as they are and listed
    in `conflicts`. An empty filter is refused: say `JobFilter(statuses=(JobStatus.FAILED,))` or
    similar."""
    check_filter(flt, "requeue", "name what to requeue, e.g. JobFilter(statuses=('failed',))")
    check_batch_size(batch_size)
    params = requeue_params(reason, attempts, registry, reset_steps)
    _check_cascade(cascade)
    revived: list[UUID] = []
    counts: dict[JobStatus, int] = {}
    ids: list[UUID] = []
    conflicts: dict[UUID, UUID] = {}
    batches = 0
    after: UUID | None = None
    while True:
        rows = await backend.job_requeue_where_batch(flt, params, after=after, limit=batch_size, cascade=cascade)
        if not rows:
            break
        revived += rows[0].revived
        batches += 1
        after = rows[-1].job_id
        for row in rows:
            if row.requeued:
                ids.append(row.job_id)
                counts[row.previous_status] = counts.get(row.previous_status, 0) + 1
            elif row.conflict_job_id is not None:
                conflicts[row.job_id] = row.conflict_job_id
        if progress is not None:
            progress(len(ids) + len(conflicts))
        if len(rows) < batch_size:
            break
    return BulkRequeueResult(by_previous_status=counts, job_ids=tuple(ids), conflicts=conflicts, batches=batches,
                             revived=tuple(revived))


def _check_cascade(cascade: bool) -> bool:
    return _check_flag(cascade, "cascade")


def _check_flag(value: bool, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, got {value!r}")
    return value
