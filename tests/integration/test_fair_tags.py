"""Fair share inside a queue, as the database orders it (sql/0016_fair_claims.sql): the tags producers give
to jobs with a fairness key, and the claim order they make. Real PostgreSQL; the claims are the worker's
own statements, run here one at a time so that the order of starts is exact."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from testkit import query

from taskq import JobsClient, actor, sql
from taskq.actors.declaration import ActorRegistry
from taskq.exceptions import ConfigurationError

registry = ActorRegistry()


@actor(name="fair.noop", registry=registry)
async def noop(payload: int) -> int:
    return payload


def claim(dsn: str, limit: int, queue: str = "default") -> list[str]:
    """One plain claim of `limit` jobs (the worker's job_claim): the keys of the jobs it took."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(sql.query("job_claim"), {"queues": [queue], "limit": limit, "worker_id": "w-test",
                                                     "lock_timeout": 600.0}).fetchall()
        # the jobs of one claim start together; listed in their claim order
        keys = conn.execute("SELECT coalesce(fairness_key, '') FROM taskq.jobs WHERE id = ANY(%s) "
                            "ORDER BY priority, fair_tag NULLS FIRST, scheduled_at, id", ([r[0] for r in rows],))
        return [k for (k,) in keys.fetchall()]


def drain(dsn: str, batch: int, queue: str = "default") -> list[str]:
    order: list[str] = []
    while taken := claim(dsn, batch, queue):
        order += taken
    return order


@pytest.fixture
async def client(dsn: str) -> Any:
    async with await JobsClient.connect(dsn, registry=registry) as c:
        yield c


async def test_a_key_enqueued_after_a_backlog_starts_at_once(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(2000), fairness_key="A")
    first = claim(dsn, 100)
    assert set(first) == {"A"}
    await client.enqueue_many(noop, range(50), fairness_key="B")
    after = drain(dsn, 10)
    last_b = max(i for i, k in enumerate(after) if k == "B")
    # B's 50 alternate with A's next 51 (a tie goes to the older job): none waits behind A's other 1,849
    assert last_b <= 100, after[:120]
    assert Counter(after) == {"A": 1900, "B": 50}


async def test_without_keys_the_order_is_first_in_first_out(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(300))
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE fair_tag IS NOT NULL") == [(0,)]
    assert query(dsn, "SELECT count(*) FROM taskq.fair_queues") == [(0,)]
    assert Counter(drain(dsn, 40)) == {"": 300}


async def test_weights_share_starts_in_proportion(client: JobsClient, dsn: str) -> None:
    query(dsn, "INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('default', 'A', 3)")
    await client.enqueue_many(noop, range(3000), fairness_key="A")
    await client.enqueue_many(noop, range(3000), fairness_key="B")
    order = drain(dsn, 7)
    busy = order[:4000]  # A runs out at about its 3,000th start, with B at 1,000
    for start in range(0, len(busy) - 1000 + 1, 50):
        share = busy[start:start + 1000].count("A") / 1000
        assert 0.70 <= share <= 0.80, (start, share)


async def test_jobs_without_a_key_share_the_empty_key(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(500), fairness_key="A")
    await client.enqueue_many(noop, range(500))  # the queue is fair now: these are tagged as the empty key
    share = claim(dsn, 200).count("") / 200
    assert 0.45 <= share <= 0.55


async def test_a_lower_priority_number_still_runs_first(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(300), fairness_key="A", priority=5)
    await client.enqueue_many(noop, range(100), fairness_key="B", priority=0)
    order = drain(dsn, 30)
    assert order[:100] == ["B"] * 100


async def test_per_item_keys_of_one_batch_interleave(client: JobsClient, dsn: str) -> None:
    keys = ["A"] * 300 + ["B"] * 100 + [None] * 100
    await client.enqueue_many(noop, range(500), fairness_key=keys)
    first = claim(dsn, 300)
    assert Counter(first) == {"A": 100, "B": 100, "": 100}


async def test_a_job_scheduled_later_is_tagged_when_due(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(100), fairness_key="A")
    handle = await client.enqueue(noop, -1, fairness_key="B", scheduled_at=timedelta(milliseconds=200))
    assert query(dsn, "SELECT fair_tag FROM taskq.jobs WHERE id = %s", handle.job_id) == [(float("inf"),)]
    query(dsn, "UPDATE taskq.jobs SET scheduled_at = now() - interval '1 second' WHERE id = %s", handle.job_id)
    assert query(dsn, "SELECT taskq.fair_promote_v16(ARRAY['default'])") == [(1,)]
    (tag,) = query(dsn, "SELECT fair_tag FROM taskq.jobs WHERE id = %s", handle.job_id)[0]
    assert tag < float("inf")
    # due, it took its place near the head instead of behind A's backlog
    order = claim(dsn, 5)
    assert "B" in order


async def test_a_weight_change_respaces_a_keys_ready_jobs(client: JobsClient, dsn: str) -> None:
    await client.enqueue_many(noop, range(1000), fairness_key="A")
    await client.enqueue_many(noop, range(1000), fairness_key="B")
    query(dsn, "INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('default', 'B', 4)")
    assert query(dsn, "SELECT taskq.fair_retag_v16('default', 'B')") == [(1000,)]
    share = claim(dsn, 500).count("B") / 500
    assert 0.75 <= share <= 0.85


async def test_bad_fairness_keys_are_refused_before_anything_is_written(client: JobsClient, dsn: str) -> None:
    for bad in ["x" * 201, "a\nb", "", "tab\there", 7]:
        with pytest.raises(ConfigurationError, match="fairness_key"):
            await client.enqueue(noop, 1, fairness_key=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="fairness_key: 1 keys for 2 payloads"):
        await client.enqueue_many(noop, [1, 2], fairness_key=["A"])
    with pytest.raises(ConfigurationError, match="fairness_key"):
        await client.enqueue_many(noop, [1, 2], fairness_key=["A", "b\x00"])
    assert query(dsn, "SELECT count(*) FROM taskq.jobs") == [(0,)]


async def test_the_database_refuses_a_bad_key_written_directly(dsn: str) -> None:
    for bad in ["x" * 201, "a\x01b", ""]:
        with pytest.raises(psycopg.errors.CheckViolation):
            query(dsn, "INSERT INTO taskq.jobs (actor, fairness_key) VALUES ('x', %s)", bad)
    with pytest.raises(psycopg.errors.CheckViolation):
        query(dsn, "INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('q', 'k', 'NaN')")
    with pytest.raises(psycopg.errors.CheckViolation):
        query(dsn, "INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('q', 'k', 0)")
