"""Schema 22 (sql/0022_lean_history_indexes.sql): job_events keyed by (job_id, id), no index on attempts by
worker. Upgrading a database that holds events and attempts keeps every row, and a job's timeline reads by
the new key; an event id taken twice for one job is still refused."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection, errors
from testkit import migrate_until

from taskq.backend.migrations import migrate

HISTORY = """
WITH j AS (
    INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, started_at, finished_at)
    SELECT 'app.act', 'succeeded', 1, 1, now(), now() FROM generate_series(1, 300) RETURNING id
), a AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, finished_at, outcome)
    SELECT id, 1, 1, 'w1', now(), 'succeeded' FROM j
)
INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt)
SELECT id, 'state_change', s.f, s.t, 1 FROM j,
       (VALUES ('pending', 'running'), ('running', 'succeeded')) AS s (f, t)
"""


async def rows(conn: AsyncConnection[Any], table: str) -> list[tuple[Any, ...]]:
    cur = await conn.execute(f"SELECT t::text FROM taskq.{table} AS t ORDER BY t::text")
    return await cur.fetchall()


async def test_the_upgrade_keeps_every_event_and_attempt_and_keys_events_by_job(
    empty_conn: AsyncConnection[Any],
) -> None:
    await migrate_until(empty_conn, 21)
    await empty_conn.execute(HISTORY)
    events, attempts = await rows(empty_conn, "job_events"), await rows(empty_conn, "job_attempts")
    assert len(events) == 600 and len(attempts) == 300
    await migrate(empty_conn)
    assert await rows(empty_conn, "job_events") == events and await rows(empty_conn, "job_attempts") == attempts
    cur = await empty_conn.execute(
        "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('job_events', 'job_attempts')")
    indexes = dict(await cur.fetchall())
    assert set(indexes) == {"job_events_pkey", "job_attempts_pkey", "job_attempts_retention_idx"}
    assert "(job_id, id)" in indexes["job_events_pkey"]
    # a job's timeline, as the dashboard pages it, reads by the key
    job = (await (await empty_conn.execute("SELECT job_id FROM taskq.job_events LIMIT 1")).fetchone() or [None])[0]
    await empty_conn.execute("SET enable_seqscan = off")
    plan = "\n".join(r[0] for r in await (await empty_conn.execute(
        "EXPLAIN SELECT id FROM taskq.job_events WHERE job_id = %s AND id < 1000 ORDER BY id DESC LIMIT 5",
        (job,))).fetchall())
    assert "job_events_pkey" in plan, plan
    # the key still refuses one event id twice for a job
    first = await (await empty_conn.execute("SELECT id FROM taskq.job_events WHERE job_id = %s LIMIT 1",
                                            (job,))).fetchone()
    assert first is not None
    with pytest.raises(errors.UniqueViolation, match="job_events_pkey"):
        await empty_conn.execute("INSERT INTO taskq.job_events (id, job_id, kind) OVERRIDING SYSTEM VALUE "
                           "VALUES (%s, %s, 'note')", (first[0], job))
