"""The backend's queue-control statements (part of the SQL layer, split from backend.py by noun): queue
stats, pause and resume, limits, and the state a waiting job waits on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

from psycopg.rows import dict_row

from taskq import sql
from taskq.backend.core import Backend, reports_outage
from taskq.models import ActorLimitsInfo, QueueLimits, QueueStats, QueueStatsReport

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
                limits=limits_of(r, "concurrency_limit"),
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
