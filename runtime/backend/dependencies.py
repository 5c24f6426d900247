"""The backend's job dependencies (part of the SQL layer, split from backend.py by noun): insert jobs that
wait on parents, read a job's edges and its parents' results, and revive cascaded children at a requeue.

The cascade itself is not here: it runs in the database, in the parents' own terminal transactions
(the statement trigger jobs_settle_dependents, migration 11), whichever statement wrote the terminal
status, up to one chunk of edges; the worker's resolver (taskq.worker.resolver) settles the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq import sql
from taskq.backend.caller import caller_cursor
from taskq.backend.params import JobBatch
from taskq.exceptions import DependencyNotFound
from taskq.models import JobStatus


@dataclass(frozen=True, slots=True)
class DependentWrite:
    """What the server decided for a batch of jobs sharing their parents (one status for all)."""

    status: str
    scheduled_at: datetime
    schedule_to_close: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class DependencyEdge:
    """One edge seen from a job: `side` 'parent' (the job waits on `job_id`) or 'child' (`job_id` waits on
    the job). `status` is that job's status now (None once retention deleted it); `parent_status` how the
    parent ended when the edge resolved (None while unresolved)."""

    side: str
    job_id: UUID
    status: JobStatus | None
    actor: str | None
    resolved_at: datetime | None
    parent_status: JobStatus | None


async def insert_dependent(
    conn: AsyncConnection[Any], batch: JobBatch, parent_ids: tuple[UUID, ...], mode: str, *, notify: bool = True
) -> DependentWrite:
    """Insert `batch` (its jobs share every option and the parents), in the caller's transaction, which
    must roll back on DependencyNotFound: the parents' has_dependents marks are written before it is known."""
    params = batch.params() | {
        "parent_ids": list(parent_ids), "dependency_mode": mode, "notify": notify,
    }
    async with caller_cursor(conn) as cur:
        await cur.execute(sql.query("job_insert_dependent"), params)
        row = await cur.fetchone()
    assert row is not None
    status, scheduled_at, schedule_to_close, created_at, missing, _ = row
    if missing:
        shown = ", ".join(map(str, missing[:5])) + (" ..." if len(missing) > 5 else "")
        raise DependencyNotFound(f"depends_on names {len(missing)} job(s) that do not exist: {shown}", tuple(missing))
    return DependentWrite(status, scheduled_at, schedule_to_close, created_at)


async def dependencies(conn: AsyncConnection[Any], job_id: UUID) -> list[DependencyEdge]:
    """The job's parents, then its children."""
    async with caller_cursor(conn) as cur:
        await cur.execute(sql.query("job_dependencies"), {"id": job_id})
        rows = await cur.fetchall()
    return [
        DependencyEdge(side, jid, JobStatus(st) if st else None, actor, resolved_at,
                       JobStatus(ps) if ps else None)
        for side, jid, st, actor, resolved_at, ps in rows
    ]


async def parent_results(conn: AsyncConnection[Any], job_id: UUID) -> list[tuple[UUID, str, JobStatus, Any]]:
    """(parent id, actor, status, stored result) for every parent of the job."""
    async with caller_cursor(conn) as cur:
        await cur.execute(sql.query("job_parent_results"), {"id": job_id})
        return [(pid, actor, JobStatus(st), result) for pid, actor, st, result in await cur.fetchall()]


async def revive_dependents(conn: AsyncConnection[Any], ids: list[UUID], reason: str | None) -> list[UUID]:
    """After the requeue of `ids` in the same transaction: their cascade-cancelled descendants back to
    awaiting_parents. Returns the jobs revived."""
    if not ids:
        return []
    async with caller_cursor(conn) as cur:
        await cur.execute(sql.query("job_revive_dependents"), {"ids": ids, "reason": reason})
        return [r[0] for r in await cur.fetchall()]
