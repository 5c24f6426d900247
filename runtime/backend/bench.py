"""The backend of `taskq bench` (taskq.ops.bench): what it reads of the server and of its own rows, and the
deletes that leave the database as the run found it.

A run owns one queue (`taskq-bench-<8 hex>`), the jobs it writes there and their events and attempts rows,
and its workers' rows; every statement here names that queue, those job ids or those worker ids, so no other
row is read for a figure or deleted. Terminal jobs are not indexed by queue, so the job reads and deletes
walk the primary key between the lowest and the highest id the run wrote (ids are time-ordered: the range
holds only the jobs written while the run lasted) and keep those of its queue.

The statements are kept here, typed LiteralString, rather than as named blocks of taskq.sql: they move to
`sql/bench.sql` as they are once that folder is open for changes again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import LiteralString
from uuid import UUID

from psycopg.rows import dict_row

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

SERVER: LiteralString = """
SELECT current_setting('server_version') AS server_version,
       current_setting('synchronous_commit') AS synchronous_commit,
       ARRAY(SELECT t FROM unnest(%(tables)s::text[]) AS t WHERE NOT has_table_privilege(t, 'DELETE'))
           AS cannot_delete
"""

# two counts, each over the partial index that holds those statuses with the queue as its first column
# (jobs_claim_idx, jobs_running_scope_idx), as taskq.queue_depth_v19 does
UNFINISHED: LiteralString = """
SELECT (SELECT count(*) FROM taskq.jobs WHERE queue = %(queue)s AND status IN ('pending', 'scheduled'))
     + (SELECT count(*) FROM taskq.jobs WHERE queue = %(queue)s AND status = 'running') AS unfinished
"""

SPAN: LiteralString = """
SELECT count(*) AS jobs, count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       extract(epoch FROM max(finished_at) - min(started_at))::float8 AS seconds
FROM taskq.jobs
WHERE id BETWEEN %(lo)s AND %(hi)s AND queue = %(queue)s
"""

# created_at is the insert's now(), started_at the claim's: both the server's clock
PICKUP: LiteralString = """
SELECT count(*) AS found, count(*) FILTER (WHERE started_at IS NULL) AS waiting,
       coalesce(array_agg(extract(epoch FROM started_at - created_at)::float8 ORDER BY id)
                    FILTER (WHERE started_at IS NOT NULL), '{}') AS latencies
FROM taskq.jobs
WHERE id = ANY(%(ids)s::uuid[])
"""

# One bounded batch of the run's jobs, in id order from `after`, with every row keyed by their ids. The ids go
# to the other deletes as one array (an InitPlan), so each is an index scan of its job_id index. Lease losses
# are the workers' rows, deleted with them (DELETE_WORKERS).
DELETE_JOBS: LiteralString = """
WITH gone AS (
    DELETE FROM taskq.jobs AS j
    WHERE j.id IN (SELECT id FROM taskq.jobs
                   WHERE id > %(after)s AND id <= %(hi)s AND queue = %(queue)s
                   ORDER BY id LIMIT %(limit)s)
    RETURNING j.id
), doomed AS MATERIALIZED (
    SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids FROM gone
), events AS (
    DELETE FROM taskq.job_events WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), attempts AS (
    DELETE FROM taskq.job_attempts WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), steps AS (
    DELETE FROM taskq.job_steps WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), signals AS (
    DELETE FROM taskq.job_signals WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), edges AS (
    DELETE FROM taskq.job_dependencies
    WHERE parent_id = ANY((SELECT ids FROM doomed)::uuid[]) OR child_id = ANY((SELECT ids FROM doomed)::uuid[])
    RETURNING 1
), backlog AS (
    DELETE FROM taskq.dependency_backlog WHERE parent_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
)
SELECT cardinality(d.ids) AS jobs, d.ids[cardinality(d.ids)] AS last,
       (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM steps) + (SELECT count(*) FROM signals) + (SELECT count(*) FROM edges)
           + (SELECT count(*) FROM backlog) AS other
FROM doomed AS d
"""

# The queue's row is the one its first worker registered (worker_register); queue_events has rows only if
# someone paused or limited the run's queue meanwhile.
DELETE_WORKERS: LiteralString = """
WITH workers AS (
    DELETE FROM taskq.workers WHERE id = ANY(%(workers)s::text[]) RETURNING 1
), losses AS (
    DELETE FROM taskq.lease_losses WHERE worker_id = ANY(%(workers)s::text[]) RETURNING 1
), queue AS (
    DELETE FROM taskq.queues WHERE name = %(queue)s RETURNING 1
), queue_events AS (
    DELETE FROM taskq.queue_events WHERE queue = %(queue)s RETURNING 1
)
SELECT (SELECT count(*) FROM workers) AS workers, (SELECT count(*) FROM losses) AS losses,
       (SELECT count(*) FROM queue) + (SELECT count(*) FROM queue_events) AS queue
"""


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
        await cur.execute(SERVER, {"tables": list(CLEANED_TABLES)})
        row = await cur.fetchone()
    assert row is not None
    return ServerFacts(str(row["server_version"]), str(row["synchronous_commit"]), tuple(row["cannot_delete"]))


@reports_outage
async def bench_unfinished(backend: Backend, queue: str) -> int:
    """Jobs of the queue pending, scheduled or running."""
    async with backend.pool.connection() as conn:
        cur = await conn.execute(UNFINISHED, {"queue": queue})
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@reports_outage
async def bench_span(backend: Backend, jobs: JobRange) -> DrainSpan:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(SPAN, {"queue": jobs.queue, "lo": jobs.lo, "hi": jobs.hi})
        row = await cur.fetchone()
    assert row is not None
    seconds = row["seconds"]
    return DrainSpan(int(row["jobs"]), int(row["succeeded"]), None if seconds is None else float(seconds))


@reports_outage
async def bench_pickup(backend: Backend, ids: list[UUID]) -> Pickup:
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(PICKUP, {"ids": ids})
        row = await cur.fetchone()
    assert row is not None
    return Pickup(int(row["found"]), int(row["waiting"]), tuple(float(v) for v in row["latencies"]))


@reports_outage
async def bench_delete_jobs(backend: Backend, jobs: JobRange, *, after: UUID, limit: int) -> DeletedJobs:
    """Delete up to `limit` of the run's jobs with ids above `after`, lowest first, with their rows, in one
    transaction."""
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(DELETE_JOBS, {"queue": jobs.queue, "hi": jobs.hi, "after": after, "limit": limit})
        row = await cur.fetchone()
    assert row is not None
    return DeletedJobs(int(row["jobs"]), int(row["events"]), int(row["attempts"]), int(row["other"]), row["last"])


@reports_outage
async def bench_delete_workers(backend: Backend, queue: str, workers: list[str]) -> DeletedWorkers:
    """Delete the rows of these workers (registration, lease losses) and the queue's own rows."""
    async with backend.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(DELETE_WORKERS, {"queue": queue, "workers": workers})
        row = await cur.fetchone()
    assert row is not None
    return DeletedWorkers(int(row["workers"]), int(row["losses"]), int(row["queue"]))
