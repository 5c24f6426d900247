"""Enqueue in a SQLAlchemy Session's or Connection's transaction (taskq.contrib.sqlalchemy): the job
commits and rolls back with it, sync and async."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from testkit import query

from taskq import JobsClient, SyncJobsClient
from taskq.contrib.sqlalchemy import async_psycopg_connection, psycopg_connection
from taskq.exceptions import ConfigurationError


@pytest.fixture
def engine(dsn: str) -> Iterator[Engine]:
    eng = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(dsn))
    yield eng
    eng.dispose()


def _jobs(dsn: str) -> list[Any]:
    return [r[0] for r in query(dsn, "SELECT actor FROM taskq.jobs ORDER BY actor")]


def test_a_rolled_back_session_leaves_no_job_and_a_committed_one_keeps_it(engine: Engine, dsn: str) -> None:
    with SyncJobsClient.connect(dsn) as client:
        with Session(engine) as session:
            session.execute(text("SELECT 1"))
            client.enqueue("sa.rolled_back", 1, connection=psycopg_connection(session))
            client.enqueue_many("sa.rolled_back", [1, 2], connection=psycopg_connection(session))
            session.rollback()
        assert _jobs(dsn) == []
        with Session(engine) as session, session.begin():
            client.enqueue("sa.committed", 1, connection=psycopg_connection(session))
            assert _jobs(dsn) == []  # not before the commit
        with engine.connect() as conn:
            client.enqueue("sa.connection", 1, connection=psycopg_connection(conn))
            conn.rollback()
            client.enqueue("sa.connection", 2, connection=psycopg_connection(conn))
            conn.commit()
    assert _jobs(dsn) == ["sa.committed", "sa.connection"]


async def test_a_rolled_back_async_session_leaves_no_job(dsn: str) -> None:
    engine = create_async_engine("postgresql+psycopg://", async_creator=lambda: psycopg.AsyncConnection.connect(dsn))
    try:
        async with await JobsClient.connect(dsn) as client:
            async with AsyncSession(engine) as session:
                await client.enqueue("sa.async", 1, connection=await async_psycopg_connection(session))
                await session.rollback()
            assert _jobs(dsn) == []
            async with AsyncSession(engine) as session, session.begin():
                await client.enqueue("sa.async", 2, connection=await async_psycopg_connection(session))
    finally:
        await engine.dispose()
    assert _jobs(dsn) == ["sa.async"]


def test_the_helper_refuses_what_is_not_a_session_or_connection() -> None:
    with pytest.raises(ConfigurationError, match="needs a SQLAlchemy Session or Connection, got str"):
        psycopg_connection("postgresql://")
