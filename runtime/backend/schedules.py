"""The scheduler's SQL: sync code declarations into taskq.schedules, and one tick (lock the due rows,
insert their slot jobs, move them forward) in one transaction. Named queries from taskq.sql only."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from psycopg import AsyncConnection

from taskq import sql, tracing
from taskq.backend._conn import uuid7_many
from taskq.backend.core import Backend
from taskq.slots import Misfire, Overlap, SlotSpec


class Declared(Protocol):
    """What the store reads of a schedule declared in code (`taskq.schedules.Schedule` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> SlotSpec: ...

    @property
    def definition(self) -> str: ...

    def declaration(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class DueSchedule:
    name: str
    spec: SlotSpec
    misfire: Misfire
    max_catch_up: int
    misfire_grace: float
    overlap: Overlap
    next_run_at: datetime
    resumed_at: datetime | None
    queue: str = "default"
    actor: str = ""


@dataclass(frozen=True, slots=True)
class DueRead:
    now: datetime
    """The database's clock at the start of the tick's transaction."""
    upcoming: datetime | None
    """The earliest next slot of the schedules that are not due (None: none enabled and unpaused)."""
    any_enabled: bool
    """Whether the table has an enabled schedule at all (paused or not)."""
    due: list[DueSchedule]


@dataclass(frozen=True, slots=True)
class Fire:
    """One due schedule's outcome of a tick: its slot jobs and its next slot."""

    name: str
    slots: Sequence[datetime]
    missed: int
    next_run_at: datetime


@dataclass(frozen=True, slots=True)
class SyncOutcome:
    created: list[str]
    changed: list[str]
    """Declarations whose slot sequence changed: their next slot moved."""
    disabled: list[str]


class ScheduleStore:
    def __init__(self, backend: Backend) -> None:
        self.pool = backend.pool

    async def sync(self, schedules: Sequence[Declared], owner: str) -> SyncOutcome:
        """Upsert the declarations and disable the owner's schedules that are no longer declared, in one
        transaction. New and changed slot sequences start at their first slot after the database's now."""
        names = [s.name for s in schedules]
        async with self.pool.connection() as conn, conn.transaction():
            cur = await conn.execute(sql.query("schedule_known"), {"names": names, "owner": owner})
            rows = await cur.fetchall()
            now: datetime = rows[0][0]
            stored = {name: definition for _, name, definition, _ in rows if name is not None}
            params = [s.declaration() | {"owner": owner, "next_run_at": s.spec.next_after(now)} for s in schedules]
            if params:
                async with conn.cursor() as c:
                    await c.executemany(sql.query("schedule_upsert"), params)
            cur = await conn.execute(sql.query("schedule_disable_gone"), {"names": names, "owner": owner})
            disabled = sorted(row[0] for row in await cur.fetchall())
        return SyncOutcome(
            created=[s.name for s in schedules if s.name not in stored],
            changed=[s.name for s in schedules if s.name in stored and stored[s.name] != s.definition],
            disabled=disabled,
        )

    async def tick(self, limit: int, plan: Callable[[DueRead], list[Fire]]) -> tuple[DueRead, list[Fire], int]:
        """One tick in one transaction: read and lock the due schedules, plan their slots, write.
        Returns the read, the plan and the number of slot jobs inserted."""
        async with self.pool.connection() as conn, conn.transaction():
            read = await self._due(conn, limit)
            if not read.due:
                return read, [], 0
            fires = plan(read)
            return read, fires, (await self._fire(conn, fires, read.due)) if fires else 0

    async def _due(self, conn: AsyncConnection[Any], limit: int) -> DueRead:
        cur = await conn.execute(sql.query("schedule_due"), {"limit": limit})
        rows = await cur.fetchall()
        due = [
            DueSchedule(name, SlotSpec(cron, every, tz), misfire, max_catch_up, grace, overlap, next_run_at, resumed,
                        queue, actor)
            for (_, _, _, name, cron, every, tz, misfire, max_catch_up, grace, overlap, next_run_at, resumed, queue,
                 actor) in rows
            if name is not None
        ]
        return DueRead(now=rows[0][0], upcoming=rows[0][1], any_enabled=bool(rows[0][2]), due=due)

    async def _fire(self, conn: AsyncConnection[Any], fires: Sequence[Fire], due: Sequence[DueSchedule]) -> int:
        slot_names = [f.name for f in fires for _ in f.slots]
        slot_ids = uuid7_many(len(slot_names)) if slot_names else list[UUID]()
        with contextlib.ExitStack() as spans:
            if tracing.active() is None:
                traces: list[str | None] = [None] * len(slot_ids)
            else:  # a producer span per slot job, each the root of the job's trace, open until the write
                target = {d.name: (d.queue, d.actor) for d in due}
                traces = [spans.enter_context(tracing.producer(*target[name], job_id))
                          for name, job_id in zip(slot_names, slot_ids, strict=True)]
            cur = await conn.execute(
                sql.query("schedule_fire"),
                {
                    "names": [f.name for f in fires],
                    "next_run_ats": [f.next_run_at for f in fires],
                    "missed": [f.missed for f in fires],
                    "slot_names": slot_names,
                    "slot_times": [t for f in fires for t in f.slots],
                    "slot_ids": slot_ids,
                    "slot_traces": traces,
                },
            )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])
