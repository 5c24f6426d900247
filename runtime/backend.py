"""The only layer that executes SQL for clients: a connection pool plus typed job operations.

Query text lives in `taskq.sql`; every method here runs one named query (or one bounded loop of
them) and returns models. Worker-side operations live in `taskq.worker.store` on the same pool.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Self
from uuid import UUID

import psycopg
from psycopg import AsyncConnection, errors
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from taskq import sql
from taskq.dsn import redact_dsn
from taskq.exceptions import DatabaseUnavailable, SchemaNotReady, SchemaTooNew
from taskq.models import (
    BulkCancelResult,
    JobAttempt,
    JobEvent,
    JobFilter,
    JobRow,
    JobStatus,
)

__all__ = ["Backend", "JobInsert", "JobRow", "connect_error", "uuid7"]

JOBS_CHANNEL = "taskq_jobs"
CANCEL_CHANNEL = "taskq_cancel"


def uuid7() -> UUID:
    """A time-ordered UUID (RFC 9562 version 7), so new rows land at the right edge of the primary key."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    rand_a = (rand >> 62) & 0xFFF
    rand_b = rand & ((1 << 62) - 1)
    return UUID(int=(ms << 80) | (0x7 << 76) | (rand_a << 64) | (0b10 << 62) | rand_b)


def connect_error(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A DatabaseUnavailable naming the server (never the password) and PostgreSQL's first line."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {detail}")


@dataclass(frozen=True, slots=True)
class JobInsert:
    """One job to write: the payload is already validated and encoded as JSON text."""

    id: UUID
    actor: str
    queue: str
    payload_json: str
    priority: int
    tags: tuple[str, ...]
    max_attempts: int
    scheduled_at: datetime | None
    schedule_to_close: float | None
    parent_id: UUID | None

    def params(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "actor": self.actor,
            "queue": self.queue,
            "payload": self.payload_json,
            "priority": self.priority,
            "tags": list(self.tags),
            "max_attempts": self.max_attempts,
            "scheduled_at": self.scheduled_at,
            "schedule_to_close": self.schedule_to_close,
            "parent_id": self.parent_id,
        }


def _array_literal(items: Sequence[str]) -> str:
    """A PostgreSQL text[] literal; every element is quoted, so commas, braces and quotes survive."""
    quoted = ('"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"' for s in items)
    return "{" + ",".join(quoted) + "}"


def filter_params(flt: JobFilter) -> dict[str, Any]:
    return {
        "ids": list(flt.ids) if flt.ids else None,
        "actors": list(flt.actors) if flt.actors else None,
        "queues": list(flt.queues) if flt.queues else None,
        "statuses": flt.status_list(),
        "tags": list(flt.tags) if flt.tags else None,
        "created_before": flt.created_before,
        "created_after": flt.created_after,
    }


def row_to_job(row: dict[str, Any]) -> JobRow:
    row.pop("_n", None)
    return JobRow.model_validate(row)


async def check_schema(conn: AsyncConnection[Any]) -> int:
    """The database's schema version; raises SchemaNotReady / SchemaTooNew when it does not match."""
    try:
        cur = await conn.execute(sql.query("schema_version"))
        row = await cur.fetchone()
    except errors.UndefinedTable:
        await conn.rollback()
        raise SchemaNotReady("the database has no taskq schema: run `taskq migrate`") from None
    version = int(row[0]) if row else 0  # type: ignore[index]
    latest = sql.latest_version()
    if version < latest:
        raise SchemaNotReady(f"the taskq schema is at version {version}, this taskq needs {latest}: run `taskq migrate`")
    if version > latest:
        raise SchemaTooNew(
            f"the taskq schema is at version {version}, newer than this taskq knows ({latest}): upgrade taskq"
        )
    return version


class Backend:
    """Job operations over an autocommit connection pool. Open with `Backend.open(dsn)`."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[Any]], dsn: str) -> None:
        self.pool = pool
        self.dsn = dsn

    @classmethod
    async def open(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, check: bool = True, timeout: float = 10.0
    ) -> Self:
        """Connect once to report a clear error (and check the schema), then open the pool."""
        try:
            probe = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=int(max(1, timeout)))
        except psycopg.OperationalError as exc:
            raise connect_error(dsn, exc) from None
        try:
            if check:
                await check_schema(probe)
        finally:
            await probe.close()
        pool: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs={"autocommit": True},
            open=False,
            name="taskq",
            timeout=timeout,
        )
        await pool.open(wait=True, timeout=timeout)
        return cls(pool, dsn)

    async def close(self) -> None:
        await self.pool.close()

    # -- enqueue ---------------------------------------------------------------------------------

    async def job_insert(self, job: JobInsert, *, conn: AsyncConnection[Any] | None = None) -> JobRow:
        """Insert one job (and NOTIFY if it is due). With `conn`, runs in the caller's transaction."""
        if conn is not None:
            async with conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(sql.query("job_insert"), job.params())
                row = await cur.fetchone()
        else:
            async with self.pool.connection() as pconn, pconn.cursor(row_factory=dict_row) as cur:
                await cur.execute(sql.query("job_insert"), job.params())
                row = await cur.fetchone()
        assert row is not None
        return row_to_job(row)

    async def job_insert_many(self, jobs: Sequence[JobInsert], *, conn: AsyncConnection[Any] | None = None) -> None:
        """Insert jobs with one statement (one NOTIFY per queue)."""
        if not jobs:
            return
        params = {
            "ids": [j.id for j in jobs],
            "actors": [j.actor for j in jobs],
            "queues": [j.queue for j in jobs],
            "payloads": [j.payload_json for j in jobs],
            "priorities": [j.priority for j in jobs],
            "tags": [_array_literal(j.tags) for j in jobs],
            "max_attempts": [j.max_attempts for j in jobs],
            "scheduled_ats": [j.scheduled_at for j in jobs],
            "schedule_to_closes": [j.schedule_to_close for j in jobs],
            "parent_ids": [j.parent_id for j in jobs],
        }
        if conn is not None:
            await conn.execute(sql.query("job_insert_many"), params)
        else:
            async with self.pool.connection() as pconn:
                await pconn.execute(sql.query("job_insert_many"), params)

    # -- reads -----------------------------------------------------------------------------------

    async def get(self, job_id: UUID) -> JobRow | None:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_get"), {"id": job_id})
            row = await cur.fetchone()
        return row_to_job(row) if row else None

    async def job_status(self, job_id: UUID) -> JobStatus | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_status"), {"id": job_id})
            row = await cur.fetchone()
        return JobStatus(row[0]) if row else None

    async def job_list(self, flt: JobFilter, *, limit: int = 100) -> list[JobRow]:
        params = filter_params(flt) | {"limit": limit}
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_list"), params)
            rows = await cur.fetchall()
        return [row_to_job(r) for r in rows]

    async def job_events(self, job_id: UUID) -> list[JobEvent]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_events"), {"id": job_id})
            return [JobEvent.model_validate(r) for r in await cur.fetchall()]

    async def job_attempts(self, job_id: UUID) -> list[JobAttempt]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_attempts"), {"id": job_id})
            return [JobAttempt.model_validate(r) for r in await cur.fetchall()]

    async def job_count_by_status(self) -> dict[JobStatus, int]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_count_by_status"))
            return {JobStatus(s): int(n) for s, n in await cur.fetchall()}

    # -- cancel ----------------------------------------------------------------------------------

    async def write_cancel_request(self, job_id: UUID, reason: str | None) -> tuple[JobStatus, JobStatus] | None:
        """Atomically cancel a pending/scheduled job (CancelledBeforeStart) or flag a running one
        (cancel_phase 1, NOTIFY its worker). Returns (previous, new) status, or None if nothing changed."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_cancel_request"), {"id": job_id, "reason": reason})
            row = await cur.fetchone()
        return (JobStatus(row[0]), JobStatus(row[1])) if row else None

    async def cancel_where(self, flt: JobFilter, reason: str | None, *, batch_size: int = 1000) -> BulkCancelResult:
        """Set-based bulk cancel, drained in committed batches of at most `batch_size` rows."""
        params = filter_params(flt) | {"reason": reason, "limit": batch_size}
        counts: dict[JobStatus, int] = {}
        ids: list[UUID] = []
        batches = 0
        async with self.pool.connection() as conn:
            while True:
                cur = await conn.execute(sql.query("job_cancel_where_batch"), params)
                rows = await cur.fetchall()
                if not rows:
                    break
                batches += 1
                for job_id, prev, _ in rows:
                    ids.append(job_id)
                    status = JobStatus(prev)
                    counts[status] = counts.get(status, 0) + 1
        return BulkCancelResult(by_previous_status=counts, job_ids=tuple(ids), batches=batches)
