"""The backend's queue-control statements (part of the SQL layer, split from backend.py by noun): queue
stats, pause and resume, limits, fairness weights and keys, and the state a waiting job waits on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from taskq import sql
from taskq.backend.core import Backend, reports_outage
from taskq.models import ActorLimitsInfo, FairKeyStats, QueueLimits, QueueStats, QueueStatsReport

QUEUES_CHANNEL = "taskq_queues"
"""NOTIFY channel of queue control: the payload is a queue name, or '*' when actor limits changed."""

UNSET: Any = object()
"""A limit argument left out: keep the stored value (None removes the limit)."""


@dataclass(frozen=True, slots=True)
class LimitChange:
    """Which of a queue's limits to write, and their new values (None: remove)."""

    concurrency: int | None = UNSET
    concurrency_per_key: int | None = UNSET
    rate_limit: int | None = UNSET
    rate_period: float | None = UNSET

    def params(self) -> dict[str, Any]:
        def value(v: Any) -> Any:
            return None if v is UNSET else v

        return {
            "set_concurrency": self.concurrency is not UNSET, "concurrency": value(self.concurrency),
            "set_per_key": self.concurrency_per_key is not UNSET, "per_key": value(self.concurrency_per_key),
            "set_rate": self.rate_limit is not UNSET, "rate": value(self.rate_limit),
            "period": value(self.rate_period),
        }


@dataclass(frozen=True, slots=True)
class WaitState:
    """What a waiting job waits on (job_wait_state); counts are of now."""

    status: str
    queue: str
    actor: str
    concurrency_key: str | None
    due: bool
    paused_at: Any
    paused_by: str | None
    pause_reason: str | None
    queue_concurrency: int | None
    queue_per_key: int | None
    queue_rate: int | None
    queue_period: float | None
    queue_running: int
    queue_key_running: int
    queue_starts: int
    actor_concurrency: int | None
    actor_per_key: int | None
    actor_rate: int | None
    actor_period: float | None
    actor_running: int
    actor_key_running: int
    actor_starts: int


@dataclass(frozen=True, slots=True)
class FairWaitState:
    """What else a due waiting job waits on (job_fair_wait_state): a free slot of its actor's isolation
    class on a live worker serving its queue, and its key's share (jobs of other keys before it)."""

    status: str
    queue: str
    actor: str
    fairness_key: str | None
    fair: bool
    due: bool
    live_workers: int
    unclassed_workers: int
    knowing_workers: int
    class_: str | None
    free_workers: int
    slots: int
    slots_busy: int
    ahead_other_keys: int


AHEAD_CAP = 100_000
"""job_fair_wait_state counts the jobs of other keys before a job up to this many."""


def limits_of(row: dict[str, Any], concurrency: str) -> QueueLimits:
    return QueueLimits(concurrency=row[concurrency], concurrency_per_key=row["concurrency_per_key"],
                       rate_limit=row["rate_limit"], rate_period=row["rate_period"])


@reports_outage
async def queue_stats(backend: Backend) -> QueueStatsReport:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("queue_stats"))
        queues = [
            QueueStats(
                name=r["name"], pending=r["pending"], scheduled=r["scheduled"], running=r["running"],
                awaiting_parents=r["awaiting_parents"], failed_last_hour=r["failed_last_hour"],
                oldest_pending_age=r["oldest_pending_age"], throughput=r["throughput"], paused=r["paused"],
                paused_at=r["paused_at"], paused_by=r["paused_by"], pause_reason=r["pause_reason"],
                limits=limits_of(r, "concurrency_limit"), fairness_weights=r["fairness_weights"] or {},
            )
            for r in await cur.fetchall()
        ]
        await cur.execute(sql.query("actor_limits_list"))
        actors = [
            ActorLimitsInfo(actor=r["actor"], limits=limits_of(r, "global_concurrency"), running=r["running"],
                            declared_by=r["declared_by"], updated_at=r["updated_at"])
            for r in await cur.fetchall()
        ]
    return QueueStatsReport(queues=tuple(queues), actor_limits=tuple(actors))


@reports_outage
async def queue_set_paused(backend: Backend, name: str, paused: bool, *, by: str, reason: str | None
                           ) -> bool | None:
    """True if the queue's state changed, False if it already was so, None if no such queue."""
    async with backend.pool.connection() as conn:
        cur = await conn.execute(sql.query("queue_set_paused"),
                                 {"name": name, "paused": paused, "by": by, "reason": reason})
        row = await cur.fetchone()
    assert row is not None
    known, changed, _ = row
    return bool(changed) if known else None


@reports_outage
async def queue_set_limits(backend: Backend, name: str, change: LimitChange, *, by: str, reason: str | None
                           ) -> QueueLimits:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("queue_set_limits"), change.params() | {"name": name, "by": by, "reason": reason})
        row = await cur.fetchone()
    assert row is not None
    return limits_of(row, "concurrency_limit")


@reports_outage
async def queue_events(backend: Backend, name: str) -> list[dict[str, Any]]:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("queue_events"), {"name": name})
        return list(await cur.fetchall())


@reports_outage
async def job_wait_state(backend: Backend, job_id: UUID) -> WaitState | None:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("job_wait_state"), {"id": job_id})
        row = await cur.fetchone()
    return WaitState(**row) if row else None


@reports_outage
async def queue_set_fairness_weight(backend: Backend, name: str, key: str, weight: float, *, by: str
                                    ) -> tuple[float, int] | None:
    """Write the weight and re-space the key's ready jobs, in one transaction: (the previous weight, the
    jobs re-spaced), or None (nothing written) if no such queue."""
    async with backend.pool.connection() as conn, conn.transaction():
        cur = await conn.execute(sql.query("queue_set_fairness_weight"),
                                 {"name": name, "key": key, "weight": weight, "by": by})
        row = await cur.fetchone()
        assert row is not None
        known, previous = row
        if not known:
            return None
        cur = await conn.execute(sql.query("queue_fair_retag"), {"name": name, "key": key})
        retag = await cur.fetchone()
    assert retag is not None
    return float(previous), int(retag[0] or 0)


@reports_outage
async def queue_fairness_weights(backend: Backend, name: str) -> dict[str, float]:
    async with backend.pool.connection() as conn:
        cur = await conn.execute(sql.query("queue_fairness_weights"), {"name": name})
        return {r[0]: float(r[1]) for r in await cur.fetchall()}


@reports_outage
async def queue_known(backend: Backend, name: str) -> bool:
    async with backend.pool.connection() as conn:
        cur = await conn.execute(sql.query("queue_known"), {"name": name})
        row = await cur.fetchone()
    return bool(row and row[0])


@reports_outage
async def queue_fair_keys(backend: Backend, name: str, *, limit: int) -> list[FairKeyStats]:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("queue_fair_keys"), {"name": name, "limit": limit})
        return [FairKeyStats(**r) for r in await cur.fetchall()]


@reports_outage
async def job_fair_wait_state(backend: Backend, job_id: UUID) -> FairWaitState | None:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("job_fair_wait_state"), {"id": job_id, "cap": AHEAD_CAP})
        row = await cur.fetchone()
    if row is None:
        return None
    row["class_"] = row.pop("class")
    row["slots"], row["slots_busy"] = int(row["slots"]), int(row["slots_busy"])
    return FairWaitState(**row)
