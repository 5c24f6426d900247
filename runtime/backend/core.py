"""The only layer that executes SQL for clients: a connection pool plus typed job operations.

Query text lives in `taskq.sql`; every method here runs one named query (or one bounded loop of
them) and returns models. Worker-side operations live in `taskq.backend.workers` on the same pool.
"""


from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import replace
from datetime import datetime
from typing import Any, Self, TypeVar, cast
from uuid import UUID

import psycopg
from psycopg import AsyncConnection, errors
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from taskq import sql
from taskq.backend import unique
from taskq.backend._conn import (
    ReadWritePool,
    connect_error,
    connection_kwargs,
    is_connection_lost,
    outage_error,
    read_only_reason,
    uuid7,
)
from taskq.backend.caller import caller_cursor, check_caller_connection, schema_needed
from taskq.backend.dependencies import revive_dependents
from taskq.backend.notify import EnqueueNotifier
from taskq.backend.params import (
    UNIQUE_INSERT_TRIES,
    InsertedJob,
    JobBatch,
    JobInsert,
    RequeueParams,
    RequeueRow,
    filter_params,
    row_to_job,
)
from taskq.dsn import redact_dsn
from taskq.exceptions import (
    DatabaseUnavailable,
    SchemaNotReady,
    SchemaTooNew,
    UniqueKeyContention,
)
from taskq.models import (
    BulkCancelResult,
    JobAttempt,
    JobEvent,
    JobFilter,
    JobRow,
    JobStatus,
    ScheduleInfo,
    WorkflowCancelResult,
)

_Method = TypeVar("_Method", bound=Callable[..., Awaitable[Any]])


def reports_outage(method: _Method) -> _Method:
    """A Backend method whose lost connection surfaces as DatabaseUnavailable (never the password),
    as JobsClient.connect reports an unreachable server, instead of a raw psycopg or pool error."""

    @functools.wraps(method)
    async def wrapper(self: Backend, *args: Any, **kwargs: Any) -> Any:
        try:
            return await method(self, *args, **kwargs)
        except psycopg.Error as exc:
            if not is_connection_lost(exc):
                raise
            raise outage_error(self.dsn, exc) from exc

    return cast(_Method, wrapper)


def _tx_if(conn: AsyncConnection[Any], wanted: bool) -> AbstractAsyncContextManager[Any]:
    return conn.transaction() if wanted else nullcontext()


async def check_schema(conn: AsyncConnection[Any]) -> int:
    """The database's schema version; raises SchemaNotReady / SchemaTooNew when it does not match."""
    try:
        cur = await conn.execute(sql.query("schema_version"))
        row = await cur.fetchone()
    except errors.UndefinedTable:
        await conn.rollback()
        raise SchemaNotReady("the database has no taskq schema: run `taskq migrate`") from None
    version = int(row[0]) if row else 0
    latest = sql.latest_version()
    if version < latest:
        raise SchemaNotReady(
            f"the taskq schema is at version {version}, this taskq needs {latest}: run `taskq migrate`"
        )
    if version > latest:
        raise SchemaTooNew(
            f"the taskq schema is at version {version}, newer than this taskq knows ({latest}): upgrade taskq"
        )
    return version


class Backend:
    """Job operations over an autocommit connection pool. Open with `Backend.open(dsn)`."""

    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConnection[Any]],
        dsn: str,
        *,
        transaction_pooler: bool = False,
        database: str | None = None,
    ) -> None:
        self.pool = pool
        self.dsn = dsn
        self.transaction_pooler = transaction_pooler
        named = conninfo_to_dict(dsn).get("dbname")
        self.database: str | None = database if database is not None else (str(named) if named else None)
        """The database's name, which a caller's `connection=` must be to."""
        self.notifier = EnqueueNotifier(pool)

    @classmethod
    async def open(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, check: bool = True, timeout: float = 10.0,
        reconnect_timeout: float = 300.0, worker_id: str | None = None, transaction_pooler: bool = False,
        abandon: Callable[[], bool] | None = None,
    ) -> Self:
        """Connect once to report a clear error (and check the schema), then open the pool.

        `reconnect_timeout`: for how many seconds of an outage the pool keeps trying to reconnect in the
        background, about once a second (backend._conn.SteadyRetry), so that it connects within about a
        second of the server's return (a failover's new primary); past that, the next request tries again.

        `worker_id` names a worker's connections (see WORKER_APPLICATION_NAME), at connect time, with no
        extra round trip. `transaction_pooler`: `dsn` goes through PgBouncer in transaction mode, or the like.
        `abandon` (a worker's): when it returns True, a statement whose task is cancelled has its connection
        closed rather than cancelled on the server (backend._conn.AbandoningConnection)."""
        options = connection_kwargs(dsn, worker_id=worker_id, transaction_pooler=transaction_pooler)
        try:
            # with the pool's own options, so that a server refusing them says so here, once
            probe = await psycopg.AsyncConnection.connect(dsn, connect_timeout=int(max(1, timeout)), **options)
        except psycopg.OperationalError as exc:
            raise connect_error(dsn, exc) from None
        try:
            read_only = read_only_reason(probe)
            if worker_id is not None and read_only is not None:  # a worker only writes: say why it cannot
                raise DatabaseUnavailable(
                    f"PostgreSQL at {redact_dsn(dsn)} cannot take writes: {read_only}; a worker needs the primary "
                    "(with several hosts in the DSN, add target_session_attrs=read-write)")
            if check:
                await check_schema(probe)
            database = probe.info.dbname
        finally:
            await probe.close()
        pool: AsyncConnectionPool[AsyncConnection[Any]] = ReadWritePool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            kwargs=options,
            open=False,
            name="taskq",
            timeout=timeout,
            reconnect_timeout=reconnect_timeout,
            abandon=abandon,
        )
        await pool.open(wait=True, timeout=timeout)
        return cls(pool, dsn, transaction_pooler=transaction_pooler, database=database)

    async def close(self, *, timeout: float = 5.0) -> None:
        """Close the pool; `timeout` bounds the wait for its background tasks (reconnection attempts)."""
        try:
            await self.notifier.flush(timeout)
        finally:
            await self.pool.close(timeout=timeout)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection (autocommit) for the statements of a backend module that take one."""
        async with self.pool.connection() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A pooled connection inside one transaction, committed when the block ends without an error."""
        async with self.pool.connection() as conn, conn.transaction():
            yield conn

    # -- enqueue ---------------------------------------------------------------------------------

    async def job_insert(self, job: JobInsert, *, conn: AsyncConnection[Any] | None = None) -> JobRow:
        """Insert one job; its NOTIFY follows the commit (backend_notify). With `conn`, runs in the caller's
        transaction, which notifies as it commits."""
        return (await self.job_insert_deferred(job, conn=conn)).row()

    @reports_outage
    async def job_insert_deferred(self, job: JobInsert, *, conn: AsyncConnection[Any] | None = None) -> InsertedJob:
        """`job_insert`, leaving the JobRow to be built by the caller if it wants it."""
        notify = conn is not None or self.notifier.inline(job.options.queue)
        if conn is not None:
            check_caller_connection(conn, self.database)
        if job.unique_key is not None:
            with schema_needed(conn):
                inserted = await unique.insert_unique(self.pool, job, conn, notify=notify)
        elif conn is not None:
            with schema_needed(conn):
                async with caller_cursor(conn) as cur:
                    await cur.execute(sql.query("job_insert"), job.params())
                    written = await cur.fetchone()
        else:
            # getconn/putconn rather than pool.connection(): its `async with conn` issues a no-op
            # commit whose Python overhead is a tenth of a single enqueue (the pool is autocommit)
            params = job.params()
            notify = notify or self.notifier.quiet(job.options.queue)
            params["notify"] = notify
            pconn = await self.pool.getconn()
            try:
                cur = await pconn.execute(sql.query("job_insert"), params)
                written = await cur.fetchone()
                if (not notify and written is not None and written[0] == "pending"
                        and self.notifier.send_now(job.options.queue)):
                    notify = True  # now, after the insert's commit, on its connection
                    await self.notifier.send_on(pconn, job.options.queue)
            finally:
                await self.pool.putconn(pconn)
        if job.unique_key is None:
            assert written is not None
            status, scheduled_at, schedule_to_close, created_at, _ = written
            inserted = InsertedJob(job, status, scheduled_at, schedule_to_close, created_at)
        if not notify and inserted.status == "pending":
            self.notifier.after_commit(job.options.queue)
        return inserted

    @reports_outage
    async def job_insert_many(
        self, batch: JobBatch, *, conn: AsyncConnection[Any] | None = None
    ) -> dict[int, UUID] | None:
        """Insert a batch with one statement (one NOTIFY follows, as for job_insert). With unique keys, returns
        {index in the batch: holder id} for the jobs it did not write (None without keys)."""
        if not batch.ids:
            return None
        notify = conn is not None or self.notifier.inline(batch.options.queue)
        if conn is not None:
            check_caller_connection(conn, self.database)
        skipped: dict[int, UUID] | None = None
        if batch.unique_keys is not None:
            with schema_needed(conn):
                skipped = await unique.insert_many_unique(self.pool, batch, conn, notify=notify)
        elif conn is not None:
            with schema_needed(conn):
                async with caller_cursor(conn) as cur:
                    await cur.execute(sql.query("job_insert_many"), batch.params())
        else:
            params = batch.params()
            notify = notify or self.notifier.quiet(batch.options.queue)
            params["notify"] = notify
            pconn = await self.pool.getconn()  # see job_insert
            try:
                await pconn.execute(sql.query("job_insert_many"), params)
                if not notify and self.notifier.send_now(batch.options.queue):
                    notify = True  # see job_insert_deferred
                    await self.notifier.send_on(pconn, batch.options.queue)
            finally:
                await self.pool.putconn(pconn)
        if not notify:  # a batch scheduled ahead gets a NOTIFY it did not need: harmless
            self.notifier.after_commit(batch.options.queue)
        return skipped

    # -- reads -----------------------------------------------------------------------------------

    @reports_outage
    async def get(self, job_id: UUID) -> JobRow | None:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_get"), {"id": job_id})
            row = await cur.fetchone()
        return row_to_job(row) if row else None

    @reports_outage
    async def job_status(self, job_id: UUID) -> JobStatus | None:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_status"), {"id": job_id})
            row = await cur.fetchone()
        return JobStatus(row[0]) if row else None

    @reports_outage
    async def job_workflow_id(self, job_id: UUID) -> UUID | None:
        """The workflow the job belongs to (None: none, or no such job)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_workflow_id"), {"id": job_id})
            row = await cur.fetchone()
        return row[0] if row else None

    @reports_outage
    async def job_list(self, flt: JobFilter, *, limit: int = 100) -> list[JobRow]:
        params = filter_params(flt) | {"limit": limit}
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_list"), params)
            rows = await cur.fetchall()
        return [row_to_job(r) for r in rows]

    @reports_outage
    async def job_events(self, job_id: UUID) -> list[JobEvent]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_events"), {"id": job_id})
            return [JobEvent.model_validate(r) for r in await cur.fetchall()]

    @reports_outage
    async def job_attempts(self, job_id: UUID) -> list[JobAttempt]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("job_attempts"), {"id": job_id})
            return [JobAttempt.model_validate(r) for r in await cur.fetchall()]

    @reports_outage
    async def job_count_by_status(self) -> dict[JobStatus, int]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_count_by_status"))
            return {JobStatus(s): int(n) for s, n in await cur.fetchall()}

    # -- cancel ----------------------------------------------------------------------------------

    @reports_outage
    async def write_cancel_request(self, job_id: UUID, reason: str | None) -> tuple[JobStatus, JobStatus] | None:
        """Atomically cancel a pending/scheduled job (CancelledBeforeStart) or flag a running one
        (cancel_phase 1, NOTIFY its worker). Returns (previous, new) status, or None if nothing changed."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_cancel_request"), {"id": job_id, "reason": reason})
            row = await cur.fetchone()
        return (JobStatus(row[0]), JobStatus(row[1])) if row else None

    @reports_outage
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

    @reports_outage
    async def cancel_workflow(self, workflow_id: UUID, reason: str | None) -> WorkflowCancelResult | None:
        """Cancel every unfinished member of the workflow in one statement (job_cancel_workflow); None when no
        job carries the id."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("job_cancel_workflow"), {"workflow_id": workflow_id, "reason": reason})
            rows = await cur.fetchall()
        total = int(rows[0][0]) if rows else 0
        if total == 0:
            return None
        cancelled = suspended = requested = cancelling = 0
        ids: list[UUID] = []
        for _, job_id, prev, wait_kind, new_status, _ in rows:
            if job_id is None:
                continue
            if new_status is None:
                cancelling += 1
                continue
            ids.append(job_id)
            if prev == "running":
                requested += 1
            else:
                cancelled += 1
                suspended += prev == "scheduled" and wait_kind is not None
        return WorkflowCancelResult(
            workflow_id=workflow_id, members=total, cancelled=cancelled, suspended=suspended,
            cancel_requested=requested, already_cancelling=cancelling,
            already_ended=total - cancelled - requested - cancelling, job_ids=tuple(ids),
        )

    # -- schedules -------------------------------------------------------------------------------

    @reports_outage
    async def schedule_list(self, name: str | None = None) -> list[ScheduleInfo]:
        async with self.pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query("schedule_list"), {"name": name})
            return [ScheduleInfo.model_validate(r) for r in await cur.fetchall()]

    @reports_outage
    async def schedule_set_paused(self, name: str, paused: bool, by: str | None) -> bool | None:
        """Pause or resume; True if it changed, False if it already was so, None if no such schedule."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("schedule_set_paused"), {"name": name, "paused": paused, "by": by})
            row = await cur.fetchone()
        return bool(row[1]) if row else None

    @reports_outage
    async def schedule_trigger(self, name: str) -> tuple[UUID, datetime] | None:
        """Insert one job of the schedule now; (job id, its scheduled_for), or None if no such schedule."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(sql.query("schedule_trigger"), {"name": name, "id": uuid7()})
            row = await cur.fetchone()
        return (row[0], row[1]) if row else None

    # -- requeue ---------------------------------------------------------------------------------

    @reports_outage
    async def job_requeue(self, job_id: UUID, params: RequeueParams, *, cascade: bool = False) -> RequeueRow | None:
        """Requeue one failed, crashed or abandoned job (one fenced statement, its event included); None
        if no such job. A unique violation means a holder committed after the statement's snapshot: the
        statement changed nothing and runs again, and then names that holder. `cascade`: in the same
        transaction, its cascade-cancelled dependents wait for it again (RequeueRow.revived)."""
        values = params.params() | {"id": job_id}
        async with self.pool.connection() as conn:
            for _ in range(UNIQUE_INSERT_TRIES):
                try:
                    async with _tx_if(conn, cascade):
                        cur = await conn.execute(sql.query("job_requeue"), values)
                        row = await cur.fetchone()
                        revived = await revive_dependents(conn, [job_id] if cascade and row and row[1] else [],
                                                          params.reason)
                except errors.UniqueViolation:
                    continue
                if row is None:
                    return None
                prev, requeued, conflict, _ = row
                return RequeueRow(job_id, JobStatus(prev), bool(requeued), conflict, tuple(revived))
        raise UniqueKeyContention(f"job {job_id}: its unique key kept being taken during the requeue; try again")

    @reports_outage
    async def job_requeue_where_batch(
        self, flt: JobFilter, params: RequeueParams, *, after: UUID | None, limit: int, cascade: bool = False
    ) -> list[RequeueRow]:
        """One committed batch of a bulk requeue: the matching failure-status jobs with ids above `after`,
        at most `limit`, in id order (the caller goes on from the last id returned). `cascade`: as for
        job_requeue, the revived dependents of the batch all on its first row."""
        values = filter_params(flt) | params.params() | {"after": after, "limit": limit}
        async with self.pool.connection() as conn:
            for _ in range(UNIQUE_INSERT_TRIES):
                try:
                    async with _tx_if(conn, cascade):
                        cur = await conn.execute(sql.query("job_requeue_where_batch"), values)
                        rows = [RequeueRow(job_id, JobStatus(prev), bool(requeued), conflict)
                                for job_id, prev, requeued, conflict, _ in await cur.fetchall()]
                        revived = await revive_dependents(
                            conn, [r.job_id for r in rows if r.requeued] if cascade else [], params.reason)
                except errors.UniqueViolation:
                    continue
                if revived:
                    rows[0] = replace(rows[0], revived=tuple(revived))
                return rows
        raise UniqueKeyContention("a bulk requeue batch kept meeting unique keys taken meanwhile; try again")
