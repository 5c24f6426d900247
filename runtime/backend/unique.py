"""The backend's unique enqueue (part of the SQL layer, split from backend.py by noun): write a job
unless its key is held, and find the holder when it is.

`INSERT ... ON CONFLICT DO NOTHING` against jobs_unique_key_idx, then the holder read in a second
statement (a fresh snapshot, so a holder that committed while the insert waited is seen). The index
decides, so it is race-free, and the arbiter is always that index whatever the planner knows of the
table. (A plain INSERT behind a NOT EXISTS probe saves the server about 4 us a row, but the probe's
plan follows the table statistics: planned while the table was small, it hashed the whole table on
every batch once the table had grown, 10x slower. Not worth the risk; measured in benchmarks/README.md.)
A batch's rows are sent in key order, so concurrent batches with overlapping keys wait on each
other's keys in one order and cannot deadlock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from taskq import sql
from taskq.backend.caller import caller_cursor
from taskq.backend.params import UNIQUE_INSERT_TRIES, InsertedJob, JobBatch, JobInsert, row_to_job
from taskq.exceptions import UniqueKeyContention
from taskq.models import JobRow

Pool = AsyncConnectionPool[AsyncConnection[Any]]


async def insert_unique(
    pool: Pool, job: JobInsert, conn: AsyncConnection[Any] | None, *, notify: bool = True
) -> InsertedJob:
    """One job with a key: written, or the holder returned (InsertedJob.holder). A holder that ended
    between the insert and the lookup (scope 'active' frees its key) lets the insert try again."""
    params = job.params()
    params["notify"] = notify
    params["unique_key"] = job.unique_key
    params["unique_scope"] = job.unique_scope
    query = sql.query("job_insert_unique")
    own = conn is None
    target = await pool.getconn() if conn is None else conn  # getconn: see Backend.job_insert_deferred
    try:
        for _ in range(UNIQUE_INSERT_TRIES):
            if own:  # the pool's connections return tuples
                cur = await target.execute(query, params)
                written = await cur.fetchone()
            else:  # the caller's connection may have a row factory and cursor class of its own
                async with caller_cursor(target) as tcur:
                    await tcur.execute(query, params)
                    written = await tcur.fetchone()
            if written is not None:
                status, scheduled_at, schedule_to_close, created_at, _ = written
                return InsertedJob(job, status, scheduled_at, schedule_to_close, created_at)
            holder = await _holder(target, job.unique_key)
            if holder is not None:
                return InsertedJob(job, holder.status, holder.scheduled_at, None, holder.created_at, holder)
    finally:
        if own:
            await pool.putconn(target)
    raise UniqueKeyContention(
        f"unique key {job.unique_key!r}: its holder kept ending between insert and lookup "
        f"({UNIQUE_INSERT_TRIES} tries); try again"
    )


async def _holder(conn: AsyncConnection[Any], key: str | None) -> JobRow | None:
    async with caller_cursor(conn, dict_row) as cur:
        await cur.execute(sql.query("job_unique_holder"), {"unique_key": key})
        row = await cur.fetchone()
    return row_to_job(row) if row else None


async def insert_many_unique(
    pool: Pool, batch: JobBatch, conn: AsyncConnection[Any] | None, *, notify: bool = True
) -> dict[int, UUID]:
    """A batch with one key (or None) per job. Returns {index in the batch: holder id} for the jobs it
    did not write. Two jobs of the batch with one key: the first is written (or finds the holder), the
    others get the first's id."""
    assert batch.unique_keys is not None
    keys = batch.unique_keys
    first_of: dict[str, int] = {}
    repeats: dict[int, int] = {}
    for i, key in enumerate(keys):
        if key is not None:
            if key in first_of:
                repeats[i] = first_of[key]
            else:
                first_of[key] = i
    send: Sequence[int] = range(len(keys)) if not repeats else [i for i in range(len(keys)) if i not in repeats]
    target = await pool.getconn() if conn is None else conn  # getconn: see Backend.job_insert_deferred
    try:
        skipped = await _on_conflict(target, batch, send, notify)
    finally:
        if conn is None:
            await pool.putconn(target)
    for i, first in repeats.items():
        skipped[i] = skipped.get(first, batch.ids[first])
    return skipped


def unique_params(batch: JobBatch, rows: Sequence[int], notify: bool) -> dict[str, Any]:
    assert batch.unique_keys is not None
    params = batch.params()
    params["notify"] = notify
    if len(rows) != len(batch.ids):
        params["ids"] = [batch.ids[i] for i in rows]
        params["payloads"] = [batch.payloads_json[i] for i in rows]
        params["unique_keys"] = [batch.unique_keys[i] for i in rows]
        if params["fairness_keys"] is not None:
            params["fairness_keys"] = [params["fairness_keys"][i] for i in rows]
            params["fairness_ranks"] = [params["fairness_ranks"][i] for i in rows]
    else:
        params["unique_keys"] = batch.unique_keys
    params["unique_scope"] = batch.unique_scope
    return params


async def _on_conflict(
    conn: AsyncConnection[Any], batch: JobBatch, rows: Sequence[int], notify: bool
) -> dict[int, UUID]:
    """INSERT ... ON CONFLICT DO NOTHING, then the holders of the rows it skipped, until every row is
    written or has a holder."""
    skipped: dict[int, UUID] = {}
    for _ in range(UNIQUE_INSERT_TRIES):
        cur = await caller_cursor(conn).execute(sql.query("job_insert_many_unique"), unique_params(batch, rows, notify))
        row = await cur.fetchone()
        assert row is not None
        if row[0] == len(rows):
            return skipped  # every row written: the statement did not even send its ids back
        rows = await _resolve(conn, batch, rows, set(row[1] or ()), skipped)
        if not rows:
            return skipped
    raise contention(rows)


async def _resolve(
    conn: AsyncConnection[Any], batch: JobBatch, rows: Sequence[int], written: set[UUID], skipped: dict[int, UUID]
) -> list[int]:
    """Record the holder of each row not written; return the rows whose key turned out free again."""
    assert batch.unique_keys is not None
    keys = batch.unique_keys
    missing = [i for i in rows if batch.ids[i] not in written]
    wanted = sorted({k for i in missing if (k := keys[i]) is not None})
    cur = await caller_cursor(conn).execute(sql.query("job_unique_holders"), {"unique_keys": wanted})
    holders = {key: job_id for key, job_id in await cur.fetchall()}
    retry = []
    for i in missing:
        key = keys[i]
        holder = holders.get(key) if key is not None else None
        if holder is not None:
            skipped[i] = holder
        else:
            retry.append(i)
    return retry


def contention(rows: Sequence[int]) -> UniqueKeyContention:
    return UniqueKeyContention(
        f"{len(rows)} unique keys: their holders kept ending between insert and lookup "
        f"({UNIQUE_INSERT_TRIES} tries); try again"
    )
