"""taskq with SQLAlchemy 2 (extra `taskq[sqlalchemy]`): enqueue in a Session's or Connection's transaction.

    with Session(engine) as session, session.begin():
        session.add(order)
        client.enqueue("mail.receipt", {"order": 7}, connection=taskq.contrib.sqlalchemy.psycopg_connection(session))

The engine must use psycopg 3 (`postgresql+psycopg://`). The job is written on the very connection the
Session or Connection runs its transaction on, so it commits or rolls back with it. An AsyncSession or
AsyncConnection gives the AsyncConnection for JobsClient: `await async_psycopg_connection(session)`.
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Connection

from taskq.exceptions import ConfigurationError


def psycopg_connection(session_or_connection: Any) -> Connection[Any]:
    """The psycopg `Connection` under a SQLAlchemy `Session` or `Connection`, in its current transaction:
    one is begun if there is none, as SQLAlchemy's autobegin would at an execute(), so the job commits or
    rolls back with the next commit() or rollback()."""
    from sqlalchemy.engine import Connection as SAConnection
    from sqlalchemy.orm import Session

    if isinstance(session_or_connection, Session):
        sa_conn = session_or_connection.connection()
    elif isinstance(session_or_connection, SAConnection):
        sa_conn = session_or_connection
    else:
        raise ConfigurationError(
            f"psycopg_connection needs a SQLAlchemy Session or Connection, got {type(session_or_connection).__name__}"
        )
    if not sa_conn.in_transaction():
        sa_conn.begin()  # what SQLAlchemy's autobegin does at a Connection's first execute()
    raw = sa_conn.connection.driver_connection
    if not isinstance(raw, Connection):
        raise ConfigurationError(
            f"the SQLAlchemy engine runs on {type(raw).__module__}.{type(raw).__name__}, not psycopg 3: "
            "use a postgresql+psycopg:// URL"
        )
    return raw


async def async_psycopg_connection(session_or_connection: Any) -> AsyncConnection[Any]:
    """The psycopg `AsyncConnection` under a SQLAlchemy `AsyncSession` or `AsyncConnection`."""
    from sqlalchemy.ext.asyncio import AsyncConnection as SAAsyncConnection
    from sqlalchemy.ext.asyncio import AsyncSession

    if isinstance(session_or_connection, AsyncSession):
        sa_conn = await session_or_connection.connection()
    elif isinstance(session_or_connection, SAAsyncConnection):
        sa_conn = session_or_connection
    else:
        raise ConfigurationError(
            "async_psycopg_connection needs a SQLAlchemy AsyncSession or AsyncConnection, got "
            f"{type(session_or_connection).__name__}"
        )
    if not sa_conn.in_transaction():
        await sa_conn.begin()
    raw = (await sa_conn.get_raw_connection()).driver_connection
    if not isinstance(raw, AsyncConnection):
        raise ConfigurationError("the SQLAlchemy engine does not run on psycopg 3's AsyncConnection: use postgresql+psycopg://")
    return raw
