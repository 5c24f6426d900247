"""A Backend whose every statement is bounded in time: the web server's (`taskq.web`).

Each connection the pool hands out runs inside one transaction that starts with
`SET LOCAL statement_timeout` and `SET LOCAL idle_in_transaction_session_timeout` (sql/pool.sql), sent
with the BEGIN in one round trip, and ends when the connection goes back (committed, or rolled back after
an error, as the pool does for any connection). Why per transaction and not per session: through
PgBouncer in transaction mode a session `SET` lands on one server connection, stays there for whichever
client gets it next, and is missing from the others; PgBouncer refuses a startup `options` parameter, and
with `ignore_startup_parameters = options` it silently drops it. A `SET LOCAL` travels with the
transaction it bounds, on any server connection, and leaks to no other client.

A statement the timeout cancels raises `taskq.exceptions.StatementTimeout` (a `DatabaseUnavailable`: the
caller answers "try again later", as for an outage).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg import AsyncConnection, errors
from psycopg import sql as pgsql
from psycopg.pq import TransactionStatus

from taskq import sql
from taskq.backend._conn import ReadWritePool, connect_error, connection_kwargs, keepalive_kwargs
from taskq.backend.core import Backend, check_schema
from taskq.exceptions import StatementTimeout

__all__ = ["BoundedPool", "open_bounded"]


class BoundedPool(ReadWritePool):
    """An autocommit pool whose connections are handed out inside a transaction bounded in time."""

    def __init__(self, dsn: str, *, statement_ms: int, idle_ms: int, **options: Any) -> None:
        super().__init__(dsn, **options)
        self.statement_ms = statement_ms
        self.begin = pgsql.SQL(sql.query("bounded_tx_begin")).format(
            statement_ms=pgsql.Literal(statement_ms), idle_ms=pgsql.Literal(idle_ms))

    async def getconn(self, timeout: float | None = None) -> AsyncConnection[Any]:
        conn = await super().getconn(timeout)
        try:
            await conn.execute(self.begin, prepare=False)  # no parameters: one simple query, one round trip
        except BaseException:
            await super().putconn(conn)
            raise
        return conn

    async def putconn(self, conn: AsyncConnection[Any]) -> None:
        # `connection()` has ended the transaction already; a caller of getconn() may not have: end it as
        # autocommit would have left it (what ran without error is kept)
        status = conn.info.transaction_status
        try:
            if status == TransactionStatus.INTRANS:
                await conn.commit()
            elif status == TransactionStatus.INERROR:
                await conn.rollback()
        except psycopg.Error:
            pass  # a broken connection: the pool discards it
        await super().putconn(conn)

    @asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[AsyncConnection[Any]]:
        try:
            async with super().connection(timeout) as conn:
                yield conn
        except errors.QueryCanceled as exc:
            raise StatementTimeout(
                f"a statement took longer than the statement timeout ({self.statement_ms / 1000:g} s) and was "
                "cancelled") from exc


async def open_bounded(
    dsn: str, *, max_size: int, statement_timeout: float, idle_in_transaction_timeout: float,
    transaction_pooler: bool = False, timeout: float = 10.0, reconnect_timeout: float = 60.0,
) -> Backend:
    """`Backend.open` with a BoundedPool of 1..`max_size` connections (timeouts in seconds, > 0)."""
    try:
        probe = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=int(max(2, timeout)),
                                                      **keepalive_kwargs(dsn))
    except psycopg.OperationalError as exc:
        raise connect_error(dsn, exc) from None
    try:
        await check_schema(probe)
        database = probe.info.dbname
    finally:
        await probe.close()
    pool = BoundedPool(
        dsn,
        statement_ms=max(1, round(statement_timeout * 1000)),
        idle_ms=max(1, round(idle_in_transaction_timeout * 1000)),
        min_size=1,
        max_size=max_size,
        kwargs=connection_kwargs(dsn, worker_id=None, transaction_pooler=transaction_pooler),
        open=False,
        name="taskq-web",
        timeout=timeout,
        reconnect_timeout=reconnect_timeout,
    )
    await pool.open(wait=True, timeout=timeout)
    return Backend(pool, dsn, transaction_pooler=transaction_pooler, database=database)
