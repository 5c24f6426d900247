"""Schema 23 (sql/0023_attempts_hot_finish.sql): job_attempts_retention_idx on started_at and room on every page,
so that a worker's finish of an attempt is a HOT update (no index entry). Upgrading keeps every attempt; the
finishes of a real worker are HOT; retention still goes by each attempt's own finished_at."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection
from testkit import migrate_until, query, running_worker, wait_for

from taskq import JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import Backend
from taskq.backend.migrations import migrate
from taskq.models import PruneClass
from taskq.ops.retention import prune

pytestmark = pytest.mark.timeout(60)

ATTEMPTS = """
WITH j AS (
    INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, started_at, finished_at)
    SELECT 'app.act', 'succeeded', 1, 1, now(), now() FROM generate_series(1, 300) RETURNING id
)
-- every third attempt open (as a crashed worker's, before the sweep)
INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, finished_at, outcome)
SELECT id, 1, 1, 'w1', CASE WHEN n % 3 <> 0 THEN now() END, CASE WHEN n % 3 <> 0 THEN 'succeeded' END
FROM (SELECT id, row_number() OVER () AS n FROM j) AS numbered
"""


async def test_the_upgrade_keeps_every_attempt_and_indexes_the_start(empty_conn: AsyncConnection[Any]) -> None:
    await migrate_until(empty_conn, 22)
    await empty_conn.execute(ATTEMPTS)
    before = await (await empty_conn.execute("SELECT t::text FROM taskq.job_attempts AS t ORDER BY 1")).fetchall()
    assert len(before) == 300
    await migrate(empty_conn)
    after = await (await empty_conn.execute("SELECT t::text FROM taskq.job_attempts AS t ORDER BY 1")).fetchall()
    assert after == before
    cur = await empty_conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job_attempts'")
    indexes = dict(await cur.fetchall())
    assert set(indexes) == {"job_attempts_pkey", "job_attempts_retention_idx"}
    # no column a finish writes is indexed: not in a key, not in a predicate
    assert indexes["job_attempts_retention_idx"].endswith("USING btree (started_at)")
    for column in ("finished_at", "outcome", "error_class", "error_message"):
        assert all(column not in d for d in indexes.values()), (column, indexes)
    cur = await empty_conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'taskq.job_attempts'::regclass")
    assert (await cur.fetchone()) == (["fillfactor=40"],)


async def test_a_workers_finishes_are_hot_updates(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="hot.noop", registry=reg)
    async def noop(payload: int) -> None:
        return None

    jobs = 400
    async with await JobsClient.connect(dsn, registry=reg) as client:
        await client.enqueue_many(noop, range(jobs))
        async with running_worker(dsn, reg, concurrency=50, claim_batch_size=50):
            await wait_for(lambda: query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'")
                           == [(jobs,)], timeout=30)

    def updates() -> tuple[int, int] | None:
        # the workers' backends report their counts when idle (within a second or so)
        ((upd, hot),) = query(dsn, "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                   " WHERE relid = 'taskq.job_attempts'::regclass")
        return (upd, hot) if upd >= jobs else None

    upd, hot = await wait_for(updates, timeout=15)
    assert upd == jobs and hot == jobs, (upd, hot)


async def test_an_attempt_is_pruned_by_its_own_finish_however_long_ago_it_started(dsn: str) -> None:
    hour = 3600.0
    rows = query(dsn, """
        WITH j AS (
            INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, finished_at)
            SELECT 'seed', 'succeeded', 1, 1, now() FROM generate_series(1, 3) RETURNING id
        )
        INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at, finished_at, outcome)
        SELECT id, 1, 1, 'w', now() - interval '30 hours',
               now() - h * interval '1 hour', CASE WHEN h IS NOT NULL THEN 'succeeded' END
        FROM (SELECT id, (ARRAY[20, 2, NULL])[row_number() OVER (ORDER BY id)] AS h FROM j) AS hours
        RETURNING job_id
    """)
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, {PruneClass.SUCCEEDED: 0, PruneClass.FAILED: 0, PruneClass.ATTEMPTS: 5 * hour})
    finally:
        await backend.close()
    # started 30 h ago: the one that finished 20 h ago goes; the one that finished 2 h ago (a long run) and
    # the open one stay
    assert result.attempts == 1
    left = query(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE job_id = ANY(%s)", [r[0] for r in rows])
    assert left == [(2,)]
