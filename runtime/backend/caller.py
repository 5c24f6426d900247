"""The caller's own connection (`enqueue(..., connection=)`), part of the SQL layer split from backend.py
by noun: the checks before any statement, the cursor taskq uses on it, and the error for a database
without taskq's schema."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, errors, pq
from psycopg.rows import tuple_row

from taskq.exceptions import ConnectionUnusable, SchemaNotReady


def caller_cursor(conn: AsyncConnection[Any], row_factory: Any = tuple_row) -> AsyncCursor[Any]:
    """A cursor of taskq's own kind on a caller's connection (`enqueue(..., connection=)`): tuple rows and
    server-side binding (the `%b` arrays of enqueue_many), whatever cursor_factory and row_factory the
    caller set (Django sets a client-side binding cursor)."""
    return AsyncCursor(conn, row_factory=row_factory)


def check_caller_connection(conn: AsyncConnection[Any], database: str | None) -> None:
    """Refuse, before any statement, a caller's connection the job cannot be written on: closed, in a
    failed transaction, or to another database than the client's (compared by name: `database`)."""
    if not isinstance(conn, AsyncConnection):
        raise ConnectionUnusable(f"connection= needs a {AsyncConnection.__name__}, got {type(conn).__name__}")
    if conn.closed:
        raise ConnectionUnusable("the connection given as connection= is closed; nothing was written")
    if conn.info.transaction_status == pq.TransactionStatus.INERROR:
        raise ConnectionUnusable(
            "the connection given as connection= is in a failed transaction (an earlier statement failed): "
            "roll it back first; nothing was written"
        )
    if database is not None and conn.info.dbname != database:
        raise ConnectionUnusable(
            f"the connection given as connection= is to database {conn.info.dbname!r}, not to this client's "
            f"{database!r}: the job would commit with another database's transaction; nothing was written"
        )


@contextlib.contextmanager
def schema_needed(conn: AsyncConnection[Any] | None) -> Iterator[None]:
    """On a caller's connection, a missing (or older) taskq schema is SchemaNotReady naming `taskq migrate`
    and saying whether the caller's transaction is now aborted; on the pool's own it is left as it is."""
    try:
        yield
    except (errors.UndefinedTable, errors.UndefinedColumn):
        if conn is None:
            raise
        aborted = conn.info.transaction_status == pq.TransactionStatus.INERROR
        raise SchemaNotReady(
            "the database of the connection given as connection= has no taskq schema (or an older one): run "
            "`taskq migrate`" + ("; your transaction is now aborted: roll it back" if aborted else "")
        ) from None
