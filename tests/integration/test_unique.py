"""Unique (idempotent) enqueue against a real PostgreSQL: a duplicate writes nothing and returns the holder."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobsClient, JobStatus, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.unique import derive_unique_key

pytestmark = pytest.mark.timeout(60)


def job_count(dsn: str, key: str | None = None) -> int:
    if key is None:
        return int(query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0])
    return int(query(dsn, "SELECT count(*) FROM taskq.jobs WHERE unique_key = %s", key)[0][0])


async def test_a_duplicate_writes_nothing_and_returns_the_holder_with_created_false(
    dsn: str, client: JobsClient
) -> None:
    first = await client.enqueue("mail.send", {"to": "a"}, unique_key="invoice-42")
    second = await client.enqueue("mail.send", {"to": "b"}, unique_key="invoice-42", tags=("other",))
    assert first.created is True and second.created is False
    assert second.job_id == first.job_id
    assert second.row is not None and second.row.payload == {"to": "a"} and second.row.tags == ()
    assert second.row.unique_key == "invoice-42" and second.row.unique_scope == "active"
    assert job_count(dsn) == 1
    assert [e.kind for e in await client.events(first.job_id)] == []  # the duplicate left no trace
    written = first.row
    assert written is not None and written.unique_key == "invoice-42" and written.requeue_count == 0
    fetched = await client.get(first.job_id)
    assert fetched is not None and fetched.row == written


async def test_once_terminal_scope_active_admits_a_new_job_and_scope_retained_does_not(
    dsn: str, client: JobsClient
) -> None:
    active = await client.enqueue("a.b", 1, unique_key="k-active")
    retained = await client.enqueue("a.b", 1, unique_key="k-retained", unique_scope="retained")
    await client.cancel(active.job_id)
    await client.cancel(retained.job_id)

    again_active = await client.enqueue("a.b", 2, unique_key="k-active")
    assert again_active.created is True and again_active.job_id != active.job_id

    again_retained = await client.enqueue("a.b", 2, unique_key="k-retained", unique_scope="retained")
    assert again_retained.created is False and again_retained.job_id == retained.job_id
    assert again_retained.row is not None and again_retained.row.status is JobStatus.CANCELLED
    # a retained row holds its key against every later enqueue, whatever that call's scope
    as_active = await client.enqueue("a.b", 3, unique_key="k-retained")
    assert as_active.created is False and as_active.job_id == retained.job_id
    assert job_count(dsn, "k-active") == 2 and job_count(dsn, "k-retained") == 1


async def test_a_live_active_job_blocks_a_retained_enqueue_and_a_terminal_active_one_does_not(
    dsn: str, client: JobsClient
) -> None:
    live = await client.enqueue("a.b", 1, unique_key="k")
    blocked = await client.enqueue("a.b", 1, unique_key="k", unique_scope="retained")
    assert blocked.created is False and blocked.job_id == live.job_id
    await client.cancel(live.job_id)
    kept = await client.enqueue("a.b", 1, unique_key="k", unique_scope="retained")
    assert kept.created is True and kept.row is not None and kept.row.unique_scope == "retained"


async def test_twenty_concurrent_connections_enqueueing_one_key_give_one_row_and_twenty_handles(
    dsn: str, client: JobsClient
) -> None:
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(20)]
    start = asyncio.Event()

    async def one(i: int, conn: psycopg.AsyncConnection[Any]) -> Any:
        await start.wait()
        async with conn.transaction():
            return await client.enqueue("race.one", {"i": i}, unique_key="the-key", connection=conn)

    try:
        tasks = [asyncio.create_task(one(i, c)) for i, c in enumerate(conns)]
        start.set()
        handles = await asyncio.gather(*tasks)
    finally:
        for c in conns:
            await c.close()
    assert job_count(dsn) == 1
    (row_id,) = query(dsn, "SELECT id FROM taskq.jobs")[0]
    assert {h.job_id for h in handles} == {row_id}
    assert sum(h.created for h in handles) == 1
    # and through the client's own pool, without a caller's transaction
    pooled = await asyncio.gather(*(client.enqueue("race.two", i, unique_key="pooled") for i in range(20)))
    assert len({h.job_id for h in pooled}) == 1 and sum(h.created for h in pooled) == 1
    assert job_count(dsn, "pooled") == 1


async def test_concurrent_batches_with_overlapping_keys_write_each_key_once(dsn: str, client: JobsClient) -> None:
    """Eight enqueue_many calls at once, each with the same 50 keys in its own order (some also in the
    caller's transaction): one row per key, and every call's handles point at those rows."""
    import random

    keys = [f"k{i:02d}" for i in range(50)]
    conns = [await psycopg.AsyncConnection.connect(dsn) for _ in range(3)]

    async def batch(n: int) -> list[Any]:
        mine = keys[:]
        random.Random(n).shuffle(mine)
        if n < len(conns):
            async with conns[n].transaction():
                return await client.enqueue_many("many.race", mine, unique_key=mine, connection=conns[n])
        return await client.enqueue_many("many.race", mine, unique_key=mine)

    try:
        results = await asyncio.gather(*(batch(n) for n in range(8)))
    finally:
        for c in conns:
            await c.close()
    assert job_count(dsn) == 50
    by_key = dict(query(dsn, "SELECT unique_key, id FROM taskq.jobs"))
    for n, handles in enumerate(results):
        mine = keys[:]
        random.Random(n).shuffle(mine)
        assert [h.job_id for h in handles] == [by_key[k] for k in mine]
    assert sum(h.created for handles in results for h in handles) == 50


async def test_a_batch_that_meets_a_key_committed_meanwhile_returns_that_holder(
    dsn: str, client: JobsClient
) -> None:
    """The batch's INSERT waits on a key another transaction holds uncommitted; once that commits, the
    batch writes its other rows and reports that transaction's job as the holder."""
    async with await psycopg.AsyncConnection.connect(dsn) as other:
        async with other.transaction():
            theirs = await client.enqueue("meanwhile", 0, unique_key="contested", connection=other)
            batch = asyncio.create_task(
                client.enqueue_many("meanwhile", [1, 2, 3], unique_key=["a-free", "contested", "z-free"])
            )
            await wait_for(lambda: _waiting_on_a_lock(dsn), timeout=20)
        handles = await asyncio.wait_for(batch, 20)
    assert [h.created for h in handles] == [True, False, True]
    assert handles[1].job_id == theirs.job_id
    assert job_count(dsn) == 3


def _waiting_on_a_lock(dsn: str) -> bool:
    rows = query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                      "AND query LIKE '%%INSERT INTO taskq.jobs%%'")
    return bool(rows[0][0])


async def test_inside_the_callers_transaction_the_key_is_held_then_freed_by_the_rollback(
    dsn: str, client: JobsClient
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction(force_rollback=True):
            inside = await client.enqueue("tx.job", 1, unique_key="tx-key", connection=conn)
            again = await client.enqueue("tx.job", 2, unique_key="tx-key", connection=conn)
            assert inside.created is True and again.created is False and again.job_id == inside.job_id
            many = await client.enqueue_many("tx.job", [3, 4], unique_key=["tx-key", "tx-other"], connection=conn)
            assert [h.created for h in many] == [False, True] and many[0].job_id == inside.job_id
    assert job_count(dsn) == 0
    after = await client.enqueue("tx.job", 5, unique_key="tx-key")
    assert after.created is True and after.job_id != inside.job_id


async def test_a_mixed_enqueue_many_reports_created_per_item(dsn: str, client: JobsClient) -> None:
    existing = await client.enqueue("batch.job", 0, unique_key="k2")
    handles = await client.enqueue_many("batch.job", [1, 2, 3, 4, 5], unique_key=["k1", None, "k2", "k1", None])
    assert [h.created for h in handles] == [True, True, False, False, True]
    assert handles[2].job_id == existing.job_id
    assert handles[3].job_id == handles[0].job_id  # two items of one call: the first one wins
    assert job_count(dsn) == 4
    rows = dict(query(dsn, "SELECT payload::text, unique_key FROM taskq.jobs"))
    assert rows == {"0": "k2", "1": "k1", "2": None, "5": None}
    # several statements in one transaction (chunk_size) see each other's keys too
    chunked = await client.enqueue_many("batch.job", [6, 7, 8], unique_key=["c", "d", "c"], chunk_size=2)
    assert [h.created for h in chunked] == [True, True, False] and chunked[2].job_id == chunked[0].job_id


async def test_unique_key_true_derives_the_key_from_actor_queue_and_canonical_payload(
    dsn: str, client: JobsClient
) -> None:
    a = await client.enqueue("derive.me", {"x": 1, "y": [1, 2]}, unique_key=True)
    b = await client.enqueue("derive.me", {"y": [1, 2], "x": 1}, unique_key=True)
    other_queue = await client.enqueue("derive.me", {"x": 1, "y": [1, 2]}, unique_key=True, queue="q2")
    other_payload = await client.enqueue("derive.me", {"x": 2, "y": [1, 2]}, unique_key=True)
    assert b.created is False and b.job_id == a.job_id
    assert other_queue.created and other_payload.created
    assert a.row is not None and a.row.unique_key == derive_unique_key("derive.me", "default", '{"y":[1,2],"x":1}')
    batch = await client.enqueue_many("derive.me", [{"x": 1, "y": [1, 2]}, {"x": 9}], unique_key=True)
    assert [h.created for h in batch] == [False, True] and batch[0].job_id == a.job_id


async def test_retries_and_a_running_job_keep_the_key_and_children_enqueue_uniquely(dsn: str) -> None:
    reg = ActorRegistry()
    children: list[tuple[bool, bool]] = []
    gate = asyncio.Event()

    @actor(name="flaky", registry=reg, max_attempts=3, retry=RetryPolicy(base=0.05, jitter=0))
    async def flaky(payload: int, ctx: JobContext[int]) -> int:
        if ctx.attempt == 1:
            raise ValueError("first attempt fails")
        await gate.wait()
        # on a queue no worker here consumes: a claimed and finished child would free its key between the two
        one = await ctx.jobs.enqueue("child.job", 1, unique_key="child-key", queue="children")
        two = await ctx.jobs.enqueue("child.job", 2, unique_key="child-key", queue="children")
        children.append((one.created, two.created and two.job_id != one.job_id))
        return ctx.attempt

    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg):
        first = await client.enqueue(flaky, 1, unique_key="flaky-key")
        # attempt 1 fails and is retried (running -> scheduled -> running): the key is never released
        await wait_for(lambda: _attempt_running(client, first.job_id, 2))
        dup = await client.enqueue(flaky, 1, unique_key="flaky-key")
        assert dup.created is False and dup.job_id == first.job_id
        gate.set()
        row = await first.wait(timeout=20)
        assert row.status is JobStatus.SUCCEEDED and row.attempt == 2
        assert children == [(True, False)]
        assert job_count(dsn, "child-key") == 1
        after = await client.enqueue(flaky, 1, unique_key="flaky-key")
        assert after.created is True  # scope active: a succeeded job no longer holds the key


async def _attempt_running(client: JobsClient, job_id: Any, attempt: int) -> bool:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row.status is JobStatus.RUNNING and handle.row.attempt == attempt


async def test_a_shutdown_release_keeps_the_key_and_the_released_job_still_holds_it(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="long.one", registry=reg)
    async def long_one(payload: int, ctx: JobContext[int]) -> int:
        await ctx.cancel_event.wait()  # until the worker's shutdown asks it to stop
        raise asyncio.CancelledError

    async with await JobsClient.connect(dsn, registry=reg) as client:
        async with running_worker(dsn, reg):
            handle = await client.enqueue(long_one, 1, unique_key="long-key")
            await wait_for(lambda: _attempt_running(client, handle.job_id, 1))
        row = await handle.refresh()  # the worker stopped: running -> pending, released
        assert row.status is JobStatus.PENDING and row.interrupt_count == 1
        dup = await client.enqueue(long_one, 2, unique_key="long-key")
        assert dup.created is False and dup.job_id == handle.job_id
