"""The operator writes of the web API and the dashboard, framework-free: each wraps the one service
function of its action (taskq.ops.jobs, taskq.ops.schedules, taskq.ops.queues, the client's enqueue checks) in ONE
transaction with the permission check, the idempotency receipt, the `expected_revision` check and the
audit rows, so that all of them commit together or not at all.

Receipts (Idempotency-Key): the receipt row is the transaction's first write; a duplicate in flight
waits on its primary key, then replays the stored status and body. Only answers decided inside the
transaction are stored (200, 201, 202, 409 STATE_CONFLICT); a 400/401/403/404 rolls everything back,
receipt included, so the same key can be sent again once the request is fixed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.types.json import Jsonb

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend, JobInsert
from taskq.backend.web import AuditEntry, Tx, audit, fetch_all, fetch_one, jobs, page_params, transaction
from taskq.exceptions import QueueNotFound, ScheduleNotFound, SignalRefused, WorkflowNotFound
from taskq.models import JobFilter, JobRow, JobStatus
from taskq.ops import durable as durable_ops
from taskq.ops import jobs as job_ops
from taskq.ops import queues as queue_ops
from taskq.ops import schedules as schedule_ops
from taskq.ops.tokens import Principal
from taskq.web.problems import Problem, forbidden, not_found, problem_body

BULK_LIMIT = 1000
CANCELLABLE = (JobStatus.PENDING, JobStatus.SCHEDULED, JobStatus.RUNNING)
REQUEUEABLE = (JobStatus.FAILED, JobStatus.CRASHED, JobStatus.ABANDONED)


@dataclass(frozen=True, slots=True)
class Caller:
    """Who asks, and the request's identity: its id (X-Request-Id or made up) and Idempotency-Key."""

    principal: Principal
    request_id: str
    idempotency_key: str | None = None

    def entry(self, action: str, **fields: Any) -> AuditEntry:
        return AuditEntry(principal=self.principal.name, action=action, request_id=self.request_id,
                          idempotency_key=self.idempotency_key, **fields)


@dataclass(frozen=True, slots=True)
class Outcome:
    """An answer decided in the transaction: status and JSON body (a problem body for a 409)."""

    status: int
    body: dict[str, Any]
    replayed: bool = False

    @property
    def is_problem(self) -> bool:
        return self.status >= 400


def fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode("utf-8", "surrogatepass")).hexdigest()


def job_json(row: JobRow) -> dict[str, Any]:
    return row.model_dump(mode="json")


def shown(who: Principal, row: JobRow) -> dict[str, Any]:
    """The row as the caller may see it: whole with `jobs:read` on its queue, else only what a write
    grant may learn of the job it acts on ({"id", "status", "revision"})."""
    if who.may("jobs:read", row.queue):
        return job_json(row)
    return {"id": str(row.id), "status": str(row.status), "revision": row.revision}


def refuse(who: Principal, action: str, row: JobRow) -> Problem:
    """The refusal of `action` on a job: 404 when the caller may neither read nor act on it (its
    existence stays hidden), else 403, naming the queue only when the caller may read it."""
    if not who.may("jobs:read", row.queue) and not who.may(action, row.queue):
        return not_found(f"job {row.id}")
    return forbidden(action, row.queue if who.may("jobs:read", row.queue) else None)


async def run_write(
    backend: Backend, caller: Caller, request_fingerprint: str, body: Callable[[Tx], Awaitable[Outcome]]
) -> Outcome:
    """Run `body` in one transaction, behind the caller's idempotency receipt when it sent a key."""
    async with transaction(backend) as tx:
        key = caller.idempotency_key
        if key is None:
            return await body(tx)
        who = {"principal": caller.principal.name, "key": key}
        claimed = await fetch_one(tx.conn, "receipt_claim", who | {"fingerprint": request_fingerprint})
        if claimed is None:
            first = await fetch_one(tx.conn, "receipt_get", who)
            assert first is not None and first["status"] is not None  # the first request committed
            if first["fingerprint"] != request_fingerprint:
                raise Problem(422, "IDEMPOTENCY_KEY_REUSED",
                              "this Idempotency-Key was used with a different request; use a new key")
            return Outcome(int(first["status"]), first["body"], replayed=True)
        outcome = await body(tx)
        await fetch_all(tx.conn, "receipt_store", who | {"status": outcome.status, "body": Jsonb(outcome.body)})
        return outcome


async def _locked(tx: Tx, job_id: UUID) -> JobRow:
    rows = await jobs(tx.conn, "job_lock", {"id": job_id})
    if not rows:
        raise not_found(f"job {job_id}")
    return rows[0]


def _conflict(who: Principal, detail: str, row: JobRow, **extra: Any) -> Outcome:
    return Outcome(409, problem_body(409, "STATE_CONFLICT", detail, job=shown(who, row), **extra))


async def _revision_conflict(tx: Tx, caller: Caller, action: str, row: JobRow, expected: int | None,
                             reason: str | None) -> Outcome | None:
    if expected is None or expected == row.revision:
        return None
    await audit(tx.conn, caller.entry(action, reason=reason, expected_revision=expected),
                [(row.id, row.queue, row.revision, "conflict")])
    return _conflict(caller.principal, f"the job is at revision {row.revision}, not {expected}: read it again and "
                     "decide anew", row)


async def cancel(
    backend: Backend, caller: Caller, job_id: UUID, *, reason: str | None, expected_revision: int | None,
    request_fingerprint: str,
) -> Outcome:
    """200 with the cancelled row (it was pending or scheduled); 202 with the row (running: the request
    is durably stored and cancel_phase is 1, which does not mean the job has stopped); 409 STATE_CONFLICT
    with the row (it is finished, a cancel is already in flight, or `expected_revision` is stale)."""

    async def body(tx: Tx) -> Outcome:
        row = await _locked(tx, job_id)
        if not caller.principal.may("jobs:cancel", row.queue):
            raise refuse(caller.principal, "jobs:cancel", row)
        stale = await _revision_conflict(tx, caller, "jobs:cancel", row, expected_revision, reason)
        if stale is not None:
            return stale
        result = await job_ops.cancel_job(tx.backend, job_id, reason)
        after = await _locked(tx, job_id)
        entry = caller.entry("jobs:cancel", reason=reason, expected_revision=expected_revision)
        if not result.cancellation_initiated:
            await audit(tx.conn, entry, [(job_id, after.queue, after.revision, "conflict")])
            why = "a cancel is already in flight" if after.status == JobStatus.RUNNING else f"it is {after.status}"
            return _conflict(caller.principal, f"the job cannot be cancelled: {why}", after)
        running = after.status == JobStatus.RUNNING
        await audit(tx.conn, entry, [(job_id, after.queue, after.revision,
                                      "cancel_requested" if running else "cancelled")])
        return Outcome(202 if running else 200, {"job": shown(caller.principal, after),
                                                 "previous_status": result.previous_status})

    return await run_write(backend, caller, request_fingerprint, body)


async def requeue(
    backend: Backend, caller: Caller, job_id: UUID, *, reason: str | None, attempts: int | None,
    expected_revision: int | None, registry: ActorRegistry, request_fingerprint: str,
) -> Outcome:
    """200 with the requeued row (it was failed, crashed or abandoned); 409 STATE_CONFLICT with the row
    otherwise (or when another job holds its unique key: `conflict_job_id`)."""

    async def body(tx: Tx) -> Outcome:
        row = await _locked(tx, job_id)
        if not caller.principal.may("jobs:requeue", row.queue):
            raise refuse(caller.principal, "jobs:requeue", row)
        stale = await _revision_conflict(tx, caller, "jobs:requeue", row, expected_revision, reason)
        if stale is not None:
            return stale
        result = await job_ops.requeue_job(tx.backend, job_id, reason=reason, attempts=attempts,
                                              registry=registry)
        after = await _locked(tx, job_id)
        entry = caller.entry("jobs:requeue", reason=reason, expected_revision=expected_revision)
        if not result.requeued:
            await audit(tx.conn, entry, [(job_id, after.queue, after.revision, "conflict")])
            if result.conflict_job_id is not None:
                holders = await _readable_holders(tx, caller.principal, [result.conflict_job_id])
                if result.conflict_job_id in holders:
                    return _conflict(caller.principal, f"job {result.conflict_job_id} holds this job's unique key",
                                     after, conflict_job_id=str(result.conflict_job_id))
                return _conflict(caller.principal, "another job holds this job's unique key", after)
            return _conflict(caller.principal,
                             f"only failed, crashed or abandoned jobs can be requeued; it is {after.status}", after)
        await audit(tx.conn, entry, [(job_id, after.queue, after.revision, "requeued")])
        return Outcome(200, {"job": shown(caller.principal, after), "previous_status": result.previous_status})

    return await run_write(backend, caller, request_fingerprint, body)


async def signal(backend: Backend, caller: Caller, job_id: UUID, *, name: str, payload_json: str | None,
                 request_fingerprint: str) -> Outcome:
    """Send a signal (jobs:signal on the job's queue) through taskq.ops.durable, the function `client.signal`
    calls, with its audit row ('signalled') in the same transaction: 200 with {"job", "signal_id", "name",
    "woke"} (`woke`: the job was waiting for that name and is due now); 409 STATE_CONFLICT with the row when
    the job has ended (audited as a conflict; nothing stored); 404 for a job that does not exist. The name
    and payload are checked before (400)."""

    async def body(tx: Tx) -> Outcome:
        row = await _locked(tx, job_id)
        if not caller.principal.may("jobs:signal", row.queue):
            raise refuse(caller.principal, "jobs:signal", row)
        entry = caller.entry("jobs:signal", detail={"signal": name})
        try:
            sent = await durable_ops.send_signal_json(tx.backend, job_id, name, payload_json,
                                                      sent_by=caller.principal.name)
        except SignalRefused as refused:
            await audit(tx.conn, entry, [(job_id, row.queue, row.revision, "conflict")])
            return _conflict(caller.principal, f"the job has ended ({refused.status}): a signal can no longer "
                             "reach it", row)
        after = await _locked(tx, job_id)
        await audit(tx.conn, caller.entry("jobs:signal", detail={"signal": name, "signal_id": sent.signal_id,
                                                                 "woke": sent.woke}),
                    [(job_id, after.queue, after.revision, "signalled")])
        return Outcome(200, {"job": shown(caller.principal, after), "signal_id": sent.signal_id, "name": name,
                             "woke": sent.woke})

    return await run_write(backend, caller, request_fingerprint, body)


async def cancel_workflow(backend: Backend, caller: Caller, workflow_id: UUID, *, reason: str | None,
                          request_fingerprint: str) -> Outcome:
    """Cancel a whole workflow through taskq.ops.jobs.cancel_workflow (the function of `client.cancel_workflow`
    and `taskq cancel --workflow`), with one audit row per member it changed, in the same transaction. The
    grant is jobs:cancel on the queue of every member (ended ones included): a token scoped to some queues
    may cancel only a workflow that lies wholly in them (403 naming the first other queue it may read). 404
    when no job carries the id, or when the caller may neither read nor cancel any of its queues. 200 with
    the counts (WorkflowCancelResult); the running members are asked to stop, not stopped yet."""

    async def body(tx: Tx) -> Outcome:
        queues = [r["queue"] for r in await fetch_all(tx.conn, "workflow_queues", {"workflow_id": workflow_id})]
        who = caller.principal
        if not queues or not any(who.may("jobs:read", q) or who.may("jobs:cancel", q) for q in queues):
            raise not_found(f"workflow {workflow_id}")
        for q in queues:
            if not who.may("jobs:cancel", q):
                raise forbidden("jobs:cancel", q if who.may("jobs:read", q) else None)
        try:
            result = await job_ops.cancel_workflow(tx.backend, workflow_id, reason)
        except WorkflowNotFound:  # its last member deleted by retention meanwhile
            raise not_found(f"workflow {workflow_id}") from None
        after = await tx.backend.job_list(JobFilter(ids=result.job_ids), limit=len(result.job_ids)) \
            if result.job_ids else []
        touched: list[tuple[UUID | None, str | None, int | None, str]] = [
            (r.id, r.queue, r.revision, "cancel_requested" if r.status == JobStatus.RUNNING else "cancelled")
            for r in after]
        entry = caller.entry("jobs:cancel", reason=reason, detail={"workflow_id": str(workflow_id)})
        await audit(tx.conn, entry, touched or [(None, queues[0], None, "unchanged")])
        return Outcome(200, result.model_dump(mode="json"))

    return await run_write(backend, caller, request_fingerprint, body)


async def _readable_holders(tx: Tx, who: Principal, ids: list[UUID]) -> set[UUID]:
    """Which of these jobs (holders of a unique key) the caller may read."""
    if not ids:
        return set()
    rows = await tx.backend.job_list(JobFilter(ids=tuple(ids)), limit=len(ids))
    return {r.id for r in rows if who.may("jobs:read", r.queue)}


async def enqueue(backend: Backend, caller: Caller, job: JobInsert, *, request_fingerprint: str) -> Outcome:
    """201 with the new row. When its unique key is held (one namespace across all queues: nothing is
    written but the audit row): 200 with the holder's row if the caller may read the holder's queue,
    else 409 UNIQUE_KEY_HELD with no row, id or queue of the holder, and an audit row naming only the
    requested queue (no event on the holder's timeline)."""
    if not caller.principal.may("jobs:enqueue", job.options.queue):
        raise forbidden("jobs:enqueue", job.options.queue)

    async def body(tx: Tx) -> Outcome:
        inserted = await tx.backend.job_insert_deferred(job, conn=tx.conn)
        row = inserted.row()
        if not inserted.created and not caller.principal.may("jobs:read", row.queue):
            await audit(tx.conn, caller.entry("jobs:enqueue"), [(None, job.options.queue, None, "unique_key_held")])
            return Outcome(409, problem_body(
                409, "UNIQUE_KEY_HELD", "another job holds this unique key (unique keys are one namespace across "
                "all queues); nothing was enqueued"))
        await audit(tx.conn, caller.entry("jobs:enqueue"),
                    [(row.id, row.queue, row.revision, "enqueued" if inserted.created else "unique_key_held")])
        return Outcome(201 if inserted.created else 200, {"job": job_json(row), "created": inserted.created})

    return await run_write(backend, caller, request_fingerprint, body)


async def _bulk_targets(tx: Tx, caller: Caller, action: str, flt: JobFilter, actionable: tuple[JobStatus, ...],
                        limit: int) -> tuple[list[JobRow], bool]:
    """The first `limit` matching jobs the caller may act on and read, newest first, and whether more of
    those match: both grants' queue patterns go into the statement, so a scoped token reaches its own
    jobs and `more` counts nothing it may not see. 403 when no grant covers `action` on any queue."""
    if not caller.principal.may(action):
        raise forbidden(action, None)
    statuses = [s for s in (flt.status_list() or actionable) if s in actionable]
    if not statuses:
        return [], False
    params = {
        "statuses": statuses, "queues": list(flt.queues) if flt.queues else None,
        "actors": list(flt.actors) if flt.actors else None, "tags": list(flt.tags) if flt.tags else None,
        "parent_id": None, "created_after": flt.created_after, "created_before": flt.created_before,
        "workflow_id": flt.workflow_id, "waiting": flt.waiting,
        "readable": caller.principal.readable("jobs:read"), "allowed": caller.principal.readable(action),
        "uncancelled": action == "jobs:cancel", "after_at": None, "after_id": None, "limit": limit + 1,
    }
    if params["readable"] == [] or params["allowed"] == []:
        return [], False
    rows = await jobs(tx.conn, "job_page", page_params(params))
    return rows[:limit], len(rows) > limit


async def bulk_cancel(backend: Backend, caller: Caller, flt: JobFilter, *, reason: str | None, limit: int,
                      request_fingerprint: str) -> Outcome:
    """Cancel at most `limit` matching unfinished jobs (newest first) in one transaction; the counts say
    how many by previous status, and `more` whether matching jobs were left for another call. A target
    that changed between the selection and the cancel (finished, or a cancel already requested) is
    left alone and audited as a conflict."""

    async def body(tx: Tx) -> Outcome:
        targets, more = await _bulk_targets(tx, caller, "jobs:cancel", flt, CANCELLABLE, limit)
        if not targets:
            return Outcome(200, {"matched": 0, "by_previous_status": {}, "job_ids": [], "more": more})
        result = await job_ops.cancel_jobs_where(tx.backend, JobFilter(ids=tuple(r.id for r in targets)),
                                                    reason, batch_size=len(targets))
        done = set(result.job_ids)
        after = await tx.backend.job_list(JobFilter(ids=result.job_ids), limit=len(done)) if done else []
        touched: list[tuple[UUID | None, str | None, int | None, str]] = [
            (r.id, r.queue, r.revision, "cancel_requested" if r.status == JobStatus.RUNNING else "cancelled")
            for r in after]
        touched += [(r.id, r.queue, r.revision, "conflict") for r in targets if r.id not in done]
        await audit(tx.conn, caller.entry("jobs:cancel", reason=reason, detail={"bulk": True}), touched)
        return Outcome(200, {"matched": len(targets), "by_previous_status": result.by_previous_status,
                             "job_ids": [str(i) for i in result.job_ids], "more": more})

    return await run_write(backend, caller, request_fingerprint, body)


async def bulk_requeue(backend: Backend, caller: Caller, flt: JobFilter, *, reason: str | None,
                       attempts: int | None, limit: int, registry: ActorRegistry,
                       request_fingerprint: str) -> Outcome:
    """Requeue at most `limit` matching failed, crashed or abandoned jobs in one transaction. A target whose
    unique key another job holds is a conflict (audited): `conflicts` maps it to the holder's id, or to
    null when the caller may not read the holder. When every target conflicts: 409 with the conflicts."""

    async def body(tx: Tx) -> Outcome:
        targets, more = await _bulk_targets(tx, caller, "jobs:requeue", flt, REQUEUEABLE, limit)
        if not targets:
            return Outcome(200, {"matched": 0, "by_previous_status": {}, "job_ids": [], "conflicts": {},
                                 "more": more})
        result = await job_ops.requeue_jobs_where(
            tx.backend, JobFilter(ids=tuple(r.id for r in targets)), reason=reason, attempts=attempts,
            registry=registry, batch_size=len(targets))
        done = set(result.job_ids)
        after = await tx.backend.job_list(JobFilter(ids=result.job_ids), limit=len(done)) if done else []
        touched: list[tuple[UUID | None, str | None, int | None, str]] = [
            (r.id, r.queue, r.revision, "requeued") for r in after]
        touched += [(r.id, r.queue, r.revision, "conflict") for r in targets if r.id not in done]
        await audit(tx.conn, caller.entry("jobs:requeue", reason=reason, detail={"bulk": True}), touched)
        readable = await _readable_holders(tx, caller.principal, list(set(result.conflicts.values())))
        answer: dict[str, Any] = {"matched": len(targets), "by_previous_status": result.by_previous_status,
                  "job_ids": [str(i) for i in result.job_ids],
                  "conflicts": {str(k): str(v) if v in readable else None for k, v in result.conflicts.items()},
                  "more": more}
        if not done and result.conflicts:
            return Outcome(409, problem_body(409, "STATE_CONFLICT", "every selected job conflicts: another job "
                                             "holds its unique key", **answer))
        return Outcome(200, answer)

    return await run_write(backend, caller, request_fingerprint, body)


async def schedule_action(backend: Backend, caller: Caller, name: str, verb: str, *,
                          request_fingerprint: str) -> Outcome:
    """pause, resume or trigger one schedule (schedules:write on its queue)."""

    async def body(tx: Tx) -> Outcome:
        try:
            info = await schedule_ops.get_schedule(tx.backend, name)
        except ScheduleNotFound:
            raise not_found(f"schedule named {name!r}") from None
        if not caller.principal.may("schedules:write", info.queue):
            raise forbidden("schedules:write", info.queue)
        entry = caller.entry(f"schedules:{verb}", schedule=name)
        if verb == "trigger":
            made = await schedule_ops.trigger_schedule(tx.backend, name)
            await audit(tx.conn, entry, [(made.job_id, info.queue, 1, "triggered")])
            return Outcome(200, made.model_dump(mode="json"))
        if verb == "pause":
            done = await schedule_ops.pause_schedule(tx.backend, name, by=caller.principal.name)
        else:
            done = await schedule_ops.resume_schedule(tx.backend, name)
        await audit(tx.conn, entry, [(None, info.queue, None, ("paused" if done.paused else "resumed")
                                      if done.changed else "unchanged")])
        return Outcome(200, done.model_dump(mode="json"))

    return await run_write(backend, caller, request_fingerprint, body)


async def queue_action(backend: Backend, caller: Caller, name: str, verb: str, *, reason: str | None,
                       request_fingerprint: str) -> Outcome:
    """pause or resume one queue (queues:write on it): 200 with {"name", "paused", "changed"}; the queue's
    own event (taskq.queue_events, by the caller's name) and the audit row commit together."""
    if not caller.principal.may("queues:write", name):
        raise forbidden("queues:write", name)

    async def body(tx: Tx) -> Outcome:
        change = queue_ops.pause_queue if verb == "pause" else queue_ops.resume_queue
        try:
            done = await change(tx.backend, name, reason=reason, by=caller.principal.name)
        except QueueNotFound:
            raise not_found(f"queue named {name!r} (no worker serves it and no unfinished job names it)") from None
        outcome = ("paused" if done.paused else "resumed") if done.changed else "unchanged"
        await audit(tx.conn, caller.entry(f"queues:{verb}", reason=reason), [(None, name, None, outcome)])
        return Outcome(200, done.model_dump(mode="json"))

    return await run_write(backend, caller, request_fingerprint, body)


LIMIT_FIELDS = ("concurrency", "concurrency_per_key", "rate_limit", "rate_period")


async def queue_limit(backend: Backend, caller: Caller, name: str, change: dict[str, Any], *, reason: str | None,
                      request_fingerprint: str) -> Outcome:
    """Set or remove a queue's limits (queues:write on it) through `queues.set_queue_limits`, the function
    `taskq queue limit` calls: `change` holds the limits given (a field left out is kept, None removes
    it). 404, creating nothing, for a queue the database does not know (as for a pause).
    200 with {"name", "limits"}; the queue's 'limits' event and the audit row (its detail: the change)
    commit together. A bad value is a ConfigurationError (400) raised before any write of the action:
    the transaction, the receipt included, rolls back."""
    if not caller.principal.may("queues:write", name):
        raise forbidden("queues:write", name)

    async def body(tx: Tx) -> Outcome:
        known = await fetch_one(tx.conn, "queue_known", {"name": name})
        if known is None or not known["known"]:
            raise not_found(f"queue named {name!r} (no worker serves it and no unfinished job names it)")
        done = await queue_ops.set_queue_limits(tx.backend, name, reason=reason, by=caller.principal.name,
                                             **{k: change[k] for k in LIMIT_FIELDS if k in change})
        await audit(tx.conn, caller.entry("queues:limit", reason=reason, detail={"change": change}),
                    [(None, name, None, "limited")])
        return Outcome(200, done.model_dump(mode="json"))

    return await run_write(backend, caller, request_fingerprint, body)


WEIGHT_AUDIT_ACTION = "queues:limit"
"""A fairness weight is one of the queue's settings, audited as its limits are (the detail names the key
and the weight), as `taskq queue weight` does."""


async def queue_weight(backend: Backend, caller: Caller, name: str, key: str, weight: float, *, reason: str | None,
                       request_fingerprint: str) -> Outcome:
    """Set a fairness key's weight in a queue (queues:write on it) through `queues.set_fairness_weight`, the
    function `taskq queue weight` calls: 200 with {"queue", "key", "weight", "previous", "retagged"}; the
    weight, the re-spacing of the key's ready jobs and the audit row commit together. 404, writing
    nothing, for a queue the database does not know; a bad weight or key is a ConfigurationError (400)
    raised before any write (the transaction, the receipt included, rolls back)."""
    if not caller.principal.may("queues:write", name):
        raise forbidden("queues:write", name)

    async def body(tx: Tx) -> Outcome:
        try:
            done = await queue_ops.set_fairness_weight(tx.backend, name, key, weight, by=caller.principal.name)
        except QueueNotFound:
            raise not_found(f"queue named {name!r} (no worker serves it and no unfinished job names it)") from None
        detail = {"fairness_weight": {"key": key, "weight": done.weight, "previous": done.previous}}
        await audit(tx.conn, caller.entry(WEIGHT_AUDIT_ACTION, reason=reason, detail=detail),
                    [(None, name, None, "limited" if done.changed else "unchanged")])
        return Outcome(200, done.model_dump(mode="json"))

    return await run_write(backend, caller, request_fingerprint, body)
