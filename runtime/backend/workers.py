"""Worker-side SQL: claim, heartbeat, batched finish/release writes, progress, sweeps.

Like `taskq.backend`, this module only runs named queries from `taskq.sql`; every write to a claimed
row is fenced on (id, status='running', attempt, claim_epoch, worker_id).

LOCK ORDER. Every statement that locks several job rows and waits for them takes them in id order, so that
two of them wait for each other instead of deadlocking: the bulk cancel and requeue, the workflow cancel,
the dependency cascade, the batched finish, the release and the reconcile each lock their rows in SQL
(`ORDER BY id ... FOR [NO KEY] UPDATE`) before writing them, whatever join the planner picks for the write
(the order of an UPDATE ... FROM unnest(...) is the plan's, not the array's). The claim, the sweeper and
the pruner skip locked rows (SKIP LOCKED) and never wait.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, LiteralString
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg.types.string import TextLoader

from taskq import sql
from taskq.backend.core import Backend
from taskq.models import QueueLimits

RETRY = "scheduled"

# the spec's names for the two heartbeat statements (cancellation-spec §3)
POLL_CANCEL_FLAGS_SQL = sql.query("heartbeat")
"""Renews the worker's lease (which holds every row it claimed), hands over the rows taken away from it,
and returns the cancel flags of the held rows with a cancel request: one round trip, flat in the jobs held."""
CANCEL_ESCALATION_SQL = sql.query("job_cancel_escalate")
"""cancel_phase 1 -> 2 plus its state_change event, fenced on the attempt."""


@dataclass(slots=True)
class ClaimedJob:
    id: UUID
    actor: str
    queue: str
    payload: str
    """The stored payload's JSON text: the actor's payload type validates it as JSON (one pass, no dict in
    between)."""
    attempt: int
    max_attempts: int
    claim_epoch: int
    progress: str | None
    """The last progress report's JSON text, or None."""
    schedule_to_close: datetime | None
    idempotent: bool = True
    """The row's idempotent flag: False once the job is known to belong to an `@actor(idempotent=False)`."""
    scheduled_for: datetime | None = None
    trace_context: str | None = None
    """The JSON text of the W3C trace context the job was enqueued in (OpenTelemetry), or None: read only by a
    worker that traces (taskq.contrib.otel), and by the retry of a traced attempt."""
    claim_sent: float | None = None
    """time.monotonic() when the worker sent the claim that took the job (set by its dispatcher): the claim's
    lease runs at least lock_timeout from then."""
    id_text: str | None = None
    """str(id), made once for the job's log lines (a UUID's text costs over a microsecond each time)."""


@dataclass(slots=True)
class Finish:
    """One attempt's outcome. `status` is a terminal status, or RETRY ('scheduled') with retry_delay."""

    job_id: UUID
    attempt: int
    claim_epoch: int
    status: str
    outcome: str
    result_json: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    retry_delay: float | None = None
    detail: dict[str, Any] | None = None
    trace_first: str | None = None
    """With a retry (or snooze) of a traced attempt: the JSON object merged into the row's trace_context
    (tracing.FIRST_ATTEMPT: the attempt's span) that the later attempts link to."""
    wait_kind: str | None = None
    """A sleep ('sleep') or a wait for a signal ('signal', named `wait_signal`): outcome 'sleeping' or 'waiting',
    status RETRY, retry_delay until the wake-up (inf: none)."""
    wait_signal: str | None = None


@dataclass(frozen=True, slots=True)
class HeldRow:
    """A held row as a heartbeat read it: the attempt it belongs to and its cancel phase."""

    claim_epoch: int
    cancel_phase: int


@dataclass(slots=True)
class HeartbeatRead:
    worker_row: bool
    """False when our workers row is gone: the tick must reconcile every held row."""
    lost: list[tuple[UUID, int]]
    """(job id, claim epoch) of the rows taken away from this worker since the last tick."""
    cancels: dict[UUID, HeldRow]
    """The held rows that have a cancel request."""


LIMITED_SCAN = 50
"""Rows the limited claim reads per scope, at least: a claim for one slot still looks past a few jobs
whose key or actor turns out to be full within the batch."""


@dataclass(slots=True)
class QueueControlRead:
    queues: dict[str, QueueLimits] = field(default_factory=dict)
    """Our queues that have a taskq.queues row, with their limits."""
    paused: set[str] = field(default_factory=set)
    actor_limits: int = 0
    """How many actors have fleet-wide limits (their jobs may be in any queue)."""


RECLAIM_BASE_DELAY = 1.0
RECLAIM_MAX_DELAY = 60.0
"""Seconds: the backoff of a reclaimed row that has attempts left, whoever reclaims it (the sweeper, a worker
reclaiming its own predecessor's rows, the supervisor reclaiming a dead worker's)."""


def reclaim_params(*, worker_id: str | None, cause: str, detail: str | None, reclaimer_id: str,
                   tracked: list[UUID] | None, limit: int | None) -> dict[str, Any]:
    """The parameters of `job_reclaim`: the rows of `worker_id` (every worker's expired rows when None),
    at most `limit` of them, reclaimed by `reclaimer_id` for `cause`."""
    return {"worker_id": worker_id, "cause": cause, "detail": detail, "sweeper_id": reclaimer_id,
            "tracked": tracked, "limit": limit, "base_delay": RECLAIM_BASE_DELAY, "max_delay": RECLAIM_MAX_DELAY}


async def fetch_claimed(conn: AsyncConnection[Any], query: LiteralString,
                        params: Mapping[str, Any]) -> list[ClaimedJob]:
    """Run a claim statement and make its rows ClaimedJobs, the jsonb columns as their JSON text: psycopg's
    own jsonb loader decodes each value into Python objects (~1.7 us for a small one: json.loads on bytes
    detects the encoding first), which the payload's validation then walks again, and a trace context is
    read only by a worker that traces."""
    cur = conn.cursor()
    cur.adapters.register_loader("jsonb", TextLoader)
    await cur.execute(query, params)
    return [ClaimedJob(*row) for row in await cur.fetchall()]


_CLAIMS: dict[int, LiteralString] = {}


def claim_statement(limit: int) -> LiteralString:
    """job_claim with its limit written in: the prepared statement of each claim size then keeps a generic
    plan that knows the limit (as a parameter, the generic plan guesses it, looks dear with a long backlog,
    and every claim is planned again: ~3 us of PostgreSQL per job claimed, measured in benchmarks/README.md,
    "statements.py"). One statement per claim size: at most claim_batch_size of them, and a worker draining
    a backlog asks for claim_batch_size each time."""
    text = _CLAIMS.get(limit)
    if text is None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"claim limit must be a positive int, not {limit!r}")
        # an int's digits are the only text written into the statement
        text = _CLAIMS[limit] = sql.query("job_claim").replace("%(limit)s", str(limit))
    return text


class WorkerStore:
    def __init__(self, backend: Backend, worker_id: str) -> None:
        self.backend = backend
        self.pool = backend.pool
        self.worker_id = worker_id

    async def register(self, queues: Sequence[str], concurrency: int, lock_timeout: float,
                       conn: AsyncConnection[Any] | None = None, *, capacities: Mapping[str, int] | None = None,
                       actor_isolation: Mapping[str, str] | None = None) -> None:
        """Insert or refresh our workers row with a new lease (in `conn`'s transaction when given).
        `concurrency` is the async capacity; `capacities` each class's ({"async": .., "thread": ..,
        "process": ..}), `actor_isolation` the class of each actor the worker knows."""
        caps = capacities or {}
        params = {"id": self.worker_id, "host": socket.gethostname(), "pid": os.getpid(),
                  "queues": list(queues), "concurrency": concurrency, "lock_timeout": lock_timeout,
                  "capacity_async": caps.get("async", concurrency), "capacity_thread": caps.get("thread"),
                  "capacity_process": caps.get("process"),
                  "actor_isolation": None if actor_isolation is None else Jsonb(dict(actor_isolation))}
        if conn is not None:
            await conn.execute(sql.query("worker_register"), params)
            return
        async with self.pool.connection() as own:
            await own.execute(sql.query("worker_register"), params)

    async def mark_stopping(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(sql.query("worker_stopping"), {"id": self.worker_id})

    async def deregister(self) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(sql.query("worker_deregister"), {"id": self.worker_id})

    async def claim(self, queues: Sequence[str], limit: int, lock_timeout: float) -> list[ClaimedJob]:
        async with self.pool.connection() as conn:
            return await fetch_claimed(conn, claim_statement(limit), {
                "queues": list(queues), "worker_id": self.worker_id, "lock_timeout": lock_timeout,
            })

    async def claim_classes(self, queues: Sequence[str], actors: Sequence[str], classes: Sequence[int],
                            slots: Sequence[int], lock_timeout: float) -> list[ClaimedJob]:
        """A mixed worker's plain claim (job_claim_classes): jobs of `actors` only, each actor in the class
        of the same index in `classes` (1-based into `slots`), at most `slots[class]` jobs of each class."""
        async with self.pool.connection() as conn:
            return await fetch_claimed(conn, sql.query("job_claim_classes"), {
                "queues": list(queues), "actors": list(actors), "classes": list(classes), "slots": list(slots),
                "worker_id": self.worker_id, "lock_timeout": lock_timeout,
            })

    async def claim_strays(self, queues: Sequence[str], known: Sequence[str], limit: int,
                           lock_timeout: float) -> list[ClaimedJob]:
        """Up to `limit` jobs of actors not in `known` (job_claim_strays): a mixed worker fails them at once
        (UnknownActor), as a worker of one class does the ones its job_claim takes."""
        async with self.pool.connection() as conn:
            return await fetch_claimed(conn, sql.query("job_claim_strays"), {
                "queues": list(queues), "known": list(known), "limit": limit, "worker_id": self.worker_id,
                "lock_timeout": lock_timeout,
            })

    async def claim_limited(self, queues: Sequence[str], limit: int, lock_timeout: float, *,
                            queue_limits_only: bool = False, only: Sequence[str] | None = None,
                            exclude: Sequence[str] | None = None) -> list[ClaimedJob]:
        """The limited claim (job_claim_limited): one statement in autocommit, whose function locks the
        scopes and then counts and claims with a snapshot taken under the locks; the locks go at its
        commit, with no client turn inside. `queue_limits_only`: no actor limit and no per-key limit on
        our queues, as far as the worker knows: the lighter job_claim_queue_limited (which checks that
        itself). `only`: jobs of these actors only; `exclude`: none of these actors (a worker that claims
        for each isolation class apart)."""
        params = {"queues": list(queues), "limit": limit, "scan": max(limit, LIMITED_SCAN),
                  "worker_id": self.worker_id, "lock_timeout": lock_timeout,
                  "only": None if only is None else list(only), "except": None if exclude is None else list(exclude)}
        name = "job_claim_queue_limited" if queue_limits_only else "job_claim_limited"
        async with self.pool.connection() as conn:
            return await fetch_claimed(conn, sql.query(name), params)

    async def fair_promote(self, queues: Sequence[str]) -> int:
        """Tag the due jobs of our fair queues that were written to start later (fair_promote)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("fair_promote"), {"queues": list(queues)})
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def queue_control(self, queues: Sequence[str]) -> QueueControlRead:
        """Our queues' pause and limits, and how many actor limits exist (queue_control_read)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("queue_control_read"), {"queues": list(queues)})
            rows = await cur.fetchall()
        read = QueueControlRead()
        for name, paused, concurrency, per_key, rate, period in rows:
            if name is None:
                read.actor_limits = int(concurrency)
            else:
                read.queues[name] = QueueLimits(concurrency=concurrency, concurrency_per_key=per_key,
                                                rate_limit=rate, rate_period=period)
                if paused:
                    read.paused.add(name)
        return read

    async def sync_actor_limits(self, limits: dict[str, QueueLimits]) -> int:
        """Write the limits our actors declare (an actor mapped to an empty QueueLimits has its stored limits
        removed); returns how many rows changed."""
        names = sorted(limits)
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("actor_limits_sync"), {
                "actors": names,
                "concurrency": [limits[n].concurrency for n in names],
                "per_key": [limits[n].concurrency_per_key for n in names],
                "rate": [limits[n].rate_limit for n in names],
                "period": [limits[n].rate_period for n in names],
                "by": self.worker_id,
            })
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def heartbeat(self, conn: AsyncConnection[Any], lock_timeout: float) -> HeartbeatRead:
        """POLL_CANCEL_FLAGS_SQL inside the caller's transaction."""
        cur = await conn.execute(POLL_CANCEL_FLAGS_SQL, {"worker_id": self.worker_id, "lock_timeout": lock_timeout,
                                                         "sent_at": datetime.now(UTC)})
        read = HeartbeatRead(worker_row=False, lost=[], cancels={})
        for kind, job_id, epoch, phase in await cur.fetchall():
            if kind == "worker":
                read.worker_row = epoch > 0
            elif kind == "lost":
                read.lost.append((job_id, epoch))
            else:
                read.cancels[job_id] = HeldRow(epoch, phase)
        return read

    async def reconcile(
        self, conn: AsyncConnection[Any], held: Sequence[tuple[UUID, int]], lock_timeout: float
    ) -> dict[UUID, HeldRow]:
        """Inside the caller's transaction: which of `held` (id, epoch) are still ours, renewing their
        locks. The slow path of a tick that found our workers row gone.

        Never prepared: a generic plan cannot see how many ids the array holds and, since it also
        underestimates `worker_id = $1`, joins them in a nested loop, quadratic in the jobs held."""
        cur = await conn.execute(
            sql.query("heartbeat_reconcile"),
            {"worker_id": self.worker_id, "lock_timeout": lock_timeout,
             "ids": [h[0] for h in held], "epochs": [h[1] for h in held]},
            prepare=False,
        )
        return {job_id: HeldRow(epoch, phase) for job_id, epoch, phase in await cur.fetchall()}

    async def escalate_cancel(self, conn: AsyncConnection[Any], job_id: UUID, attempt: int, epoch: int) -> bool:
        """CANCEL_ESCALATION_SQL inside the heartbeat transaction; False when rowcount is 0."""
        cur = await conn.execute(
            CANCEL_ESCALATION_SQL,
            {"id": job_id, "attempt": attempt, "epoch": epoch, "worker_id": self.worker_id},
        )
        return (await cur.fetchone()) is not None

    async def finish_batch(self, items: Sequence[Finish]) -> dict[UUID, str]:
        """Write many outcomes in one statement; returns id -> status written, for the rows whose fence
        held (a retry over an operator's cancel request is written as 'cancelled')."""
        async with self.pool.connection() as conn:
            return await self.finish_batch_in(conn, items)

    async def finish_batch_in(self, conn: AsyncConnection[Any], items: Sequence[Finish]) -> dict[UUID, str]:
        """finish_batch on `conn`, in whatever transaction it has open (ctx.transaction())."""
        params = {
            "worker_id": self.worker_id,
            "ids": [f.job_id for f in items],
            "attempts": [f.attempt for f in items],
            "epochs": [f.claim_epoch for f in items],
            "statuses": [f.status for f in items],
            "results": [f.result_json for f in items],
            "error_classes": [f.error_class for f in items],
            "error_messages": [f.error_message for f in items],
            "retry_delays": [f.retry_delay for f in items],
            "outcomes": [f.outcome for f in items],
            "details": [json.dumps(f.detail) if f.detail else None for f in items],
            "first_traces": [f.trace_first for f in items],
            "wait_kinds": [f.wait_kind for f in items],
            "wait_signals": [f.wait_signal for f in items],
        }
        cur = await conn.execute(sql.query("job_finish_batch"), params)
        return {job_id: status for job_id, status in await cur.fetchall()}

    async def release_batch(self, held: Sequence[tuple[UUID, int, int]],
                            unsafe: Sequence[bool] | None = None) -> dict[UUID, str]:
        """Give rows back to the fleet (shutdown). `unsafe[i]`: the attempt of a non-idempotent actor had to
        be forced, so it ends crashed instead. Returns id -> new status for rows whose fence held."""
        if not held:
            return {}
        flags = list(unsafe) if unsafe is not None else [False] * len(held)
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.query("job_release_batch"),
                {"worker_id": self.worker_id, "ids": [h[0] for h in held],
                 "attempts": [h[1] for h in held], "epochs": [h[2] for h in held],
                 "unsafe": flags},
            )
            return {row[0]: row[1] for row in await cur.fetchall()}

    async def mark_not_idempotent(self, job: ClaimedJob) -> bool:
        """Record on the row (fenced) that its actor is not idempotent; False if the attempt lost the row."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_mark_not_idempotent"),
                                     {"id": job.id, "attempt": job.attempt, "epoch": job.claim_epoch,
                                      "worker_id": self.worker_id})
            return (await cur.fetchone()) is not None

    async def save_progress(self, job_id: UUID, attempt: int, epoch: int, progress_json: str) -> bool:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.query("job_progress"),
                {"id": job_id, "attempt": attempt, "epoch": epoch, "progress": progress_json,
                 "worker_id": self.worker_id},
            )
            return (await cur.fetchone()) is not None

    async def sweep_expired(self, tracked: Sequence[UUID], *, limit: int = 500) -> dict[str, int]:
        """Reclaim rows whose lease ran out, and our own rows past their claim lock that we do not track
        (`tracked`: the ids this worker holds); verdict -> count."""
        return await self._reclaim(None, None, "lock_expired", limit, tracked)

    async def take_over(self) -> dict[str, int]:
        """Reclaim the running rows left under our worker id by an earlier process that used the same id
        (an explicit worker_id, a supervisor slot): at start this process holds nothing, and our fresh
        lease would otherwise keep those rows from every sweeper."""
        return await self._reclaim(self.worker_id, "was replaced by a new process with the same worker id",
                                   "worker_restarted", None, ())

    async def _reclaim(self, worker_id: str | None, detail: str | None, cause: str, limit: int | None,
                       tracked: Sequence[UUID]) -> dict[str, int]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.query("job_reclaim"),
                reclaim_params(worker_id=worker_id, cause=cause, detail=detail, reclaimer_id=self.worker_id,
                               tracked=list(tracked), limit=limit),
            )
            counts: dict[str, int] = {}
            for _, status in await cur.fetchall():
                counts[status] = counts.get(status, 0) + 1
            return counts

    async def settle_backlog(self, *, slices: int) -> int:
        """One resolver step in its own transaction: returns the backlog slices it took."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("dependency_settle_backlog"), {"slices": slices})
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    async def sweep_deadlines(self, *, limit: int = 500) -> int:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_sweep_deadline"), {"limit": limit, "sweeper_id": self.worker_id})
            return len(await cur.fetchall())

    async def clean_dead_workers(self, dead_after: float) -> None:
        async with self.pool.connection() as conn:
            await conn.execute(sql.query("workers_clean_dead"), {"dead_after": dead_after})
