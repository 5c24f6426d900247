"""The backend of `taskq bench` (taskq.ops.bench): what it reads of the server and of its own rows, and the
deletes that leave the database as the run found it.

A run owns one queue (`taskq-bench-<8 hex>`), the jobs it writes there and their events and attempts rows,
and its workers' rows; every statement here names that queue, those job ids or those worker ids, so no other
row is read for a figure or deleted. Terminal jobs are not indexed by queue, so the job reads and deletes
walk the primary key between the lowest and the highest id the run wrote (ids are time-ordered: the range
holds only the jobs written while the run lasted) and keep those of its queue.

The statements are the named blocks of sql/bench.sql.
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from psycopg.rows import dict_row

from taskq import sql
from taskq.backend.core import Backend, reports_outage

CLEANED_TABLES = (
    "taskq.jobs",
    "taskq.job_events",
    "taskq.job_attempts",
    "taskq.job_steps",
    "taskq.job_signals",
    "taskq.job_dependencies",
    "taskq.dependency_backlog",
    "taskq.lease_losses",
    "taskq.workers",
    "taskq.queues",
    "taskq.queue_events",
)
"""Every table a run may leave a row in (the job_id-keyed ones have no foreign key, so nothing cascades)."""








@dataclass(frozen=True, slots=True)
class ServerFacts:
    server_version: str
    synchronous_commit: str
    cannot_delete: tuple[str, ...]
    """The tables of CLEANED_TABLES this role may not delete from (a run could not clean up after itself)."""


@dataclass(frozen=True, slots=True)
class JobRange:
    """Jobs of one run: those of `queue` whose id lies between `lo` and `hi`."""

    queue: str
    lo: UUID
    hi: UUID


@dataclass(frozen=True, slots=True)
class DrainSpan:
    jobs: int
    succeeded: int
    seconds: float | None
    """From the first claim (min started_at) to the last finish (max finished_at); None if none finished."""


@dataclass(frozen=True, slots=True)
class Pickup:
    found: int
    waiting: int
    """Jobs of the ids not started yet."""
    latencies: tuple[float, ...]
    """Seconds from created_at to started_at of each started job."""


@dataclass(frozen=True, slots=True)
class DeletedJobs:
    jobs: int
    events: int
    attempts: int
    other: int
    """Steps, signals, dependency edges and backlog rows."""
    last: UUID | None
    """The highest id deleted (the next batch starts after it); None when nothing was left."""


@dataclass(frozen=True, slots=True)
class DeletedWorkers:
    workers: int
    losses: int
    queue: int


@reports_outage
async def bench_server(backend: Backend) -> ServerFacts:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("bench_server"), {"tables": list(CLEANED_TABLES)})
        row = await cur.fetchone()
    assert row is not None
    return ServerFacts(str(row["server_version"]), str(row["synchronous_commit"]), tuple(row["cannot_delete"]))


@reports_outage
async def bench_unfinished(backend: Backend, queue: str) -> int:
    """Jobs of the queue pending, scheduled or running."""
    async with backend.pool.connection() as conn:
        cur = await conn.execute(sql.query("bench_unfinished"), {"queue": queue})
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@reports_outage
async def bench_span(backend: Backend, jobs: JobRange) -> DrainSpan:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("bench_span"), {"queue": jobs.queue, "lo": jobs.lo, "hi": jobs.hi})
        row = await cur.fetchone()
    assert row is not None
    seconds = row["seconds"]
    return DrainSpan(int(row["jobs"]), int(row["succeeded"]), None if seconds is None else float(seconds))


@reports_outage
async def bench_pickup(backend: Backend, ids: list[UUID]) -> Pickup:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("bench_pickup"), {"ids": ids})
        row = await cur.fetchone()
    assert row is not None
    return Pickup(int(row["found"]), int(row["waiting"]), tuple(float(v) for v in row["latencies"]))


@reports_outage
async def bench_delete_jobs(backend: Backend, jobs: JobRange, *, after: UUID, limit: int) -> DeletedJobs:
    """Delete up to `limit` of the run's jobs with ids above `after`, lowest first, with their rows, in one
    transaction."""
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("bench_delete_jobs"),
                          {"queue": jobs.queue, "hi": jobs.hi, "after": after, "limit": limit})
        row = await cur.fetchone()
    assert row is not None
    return DeletedJobs(int(row["jobs"]), int(row["events"]), int(row["attempts"]), int(row["other"]), row["last"])


@reports_outage
async def bench_delete_workers(backend: Backend, queue: str, workers: list[str]) -> DeletedWorkers:
    """Delete the rows of these workers (registration, lease losses) and the queue's own rows."""
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(sql.query("bench_delete_workers"), {"queue": queue, "workers": workers})
        row = await cur.fetchone()
    assert row is not None
    return DeletedWorkers(int(row["workers"]), int(row["losses"]), int(row["queue"]))
