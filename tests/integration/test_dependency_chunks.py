"""Fan-outs larger than one chunk (migration 11): the parent's terminal transaction settles at most
taskq.settle_chunk() edges, the worker's resolver settles the rest in bounded committed steps, and the
settle is per statement (a statement finishing k parents of one child updates that child once)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any
from uuid import UUID

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFilter, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(180)

SMALL_CHUNK = 50


def set_chunk(dsn: str, chunk: int) -> None:
    """The chunk for every new connection to this test's database (the workers' too)."""
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    query(dsn, f"ALTER DATABASE {psycopg.sql.Identifier(str(dbname)).as_string(None)} "
               f"SET taskq.settle_chunk = '{chunk}'")


async def violations(dsn: str) -> list[Any]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    return list(report.violations)


def registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="chunk.ok", registry=reg)
    async def ok(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="chunk.fail", registry=reg, max_attempts=1)
    async def fail(payload: int, ctx: JobContext[int]) -> None:
        raise RuntimeError("parent broke")

    return reg


def counts(dsn: str, queue: str) -> dict[str, int]:
    return {str(s): int(n) for s, n in query(
        dsn, "SELECT status, count(*) FROM taskq.jobs WHERE queue = %s GROUP BY status", queue)}


def settled_in_parents_transaction(dsn: str, parent: UUID, queue: str) -> int:
    """Children whose settling event was written by the transaction of the parent's terminal event."""
    ((n,),) = query(dsn, """
        SELECT count(*) FROM taskq.job_events AS e JOIN taskq.jobs AS j ON j.id = e.job_id
        WHERE j.queue = %s AND e.from_status = 'awaiting_parents'
          AND e.xmin = (SELECT p.xmin FROM taskq.job_events AS p WHERE p.job_id = %s
                        AND p.to_status IN ('succeeded', 'failed') ORDER BY p.id DESC LIMIT 1)""", queue, parent)
    return int(n)


def backlog(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM taskq.dependency_backlog")[0][0])


async def fan_out(dsn: str, actor_name: str, n: int, mode: str = "on_success") -> UUID:
    """A parent (on the default queue, which the test's worker serves) and n children on queue 'kids',
    which nobody serves: they can only settle, never run."""
    async with await JobsClient.connect(dsn) as client:
        parent = await client.enqueue(actor_name, 1)
        await client.enqueue_many("chunk.ok", list(range(n)), depends_on=[parent], dependency_mode=mode,
                                  queue="kids")
        return parent.job_id


@pytest.mark.parametrize("chunk,children", [(SMALL_CHUNK, 230), (None, 2_500)])
async def test_a_fan_out_larger_than_one_chunk_settles_fully_with_a_worker(
    dsn: str, chunk: int | None, children: int
) -> None:
    if chunk is not None:
        set_chunk(dsn, chunk)
    bound = chunk or 500  # the migration's default
    parent = await fan_out(dsn, "chunk.ok", children)
    async with running_worker(dsn, registry()):
        await wait_for(lambda: counts(dsn, "kids").get("pending") == children, timeout=60)
    # the parent's own transaction settled exactly one chunk; the resolver the rest, in later transactions
    assert settled_in_parents_transaction(dsn, parent, "kids") == bound
    assert query(dsn, "SELECT count(*), sum(parents_remaining) FROM taskq.jobs WHERE queue = 'kids'")[0] == (
        children, 0)
    # each child settled once: one settling event each, and each edge resolved once, to the parent's status
    assert query(dsn, """SELECT count(*), count(DISTINCT e.job_id) FROM taskq.job_events AS e
                         JOIN taskq.jobs AS j ON j.id = e.job_id
                         WHERE j.queue = 'kids' AND e.from_status = 'awaiting_parents'""")[0] == (children, children)
    assert query(dsn, "SELECT parent_status, count(*) FROM taskq.job_dependencies GROUP BY 1") == [
        ("succeeded", children)]
    assert backlog(dsn) == 0
    assert await violations(dsn) == []


async def test_the_cancel_cascade_goes_through_the_same_chunks_down_the_graph(dsn: str) -> None:
    set_chunk(dsn, SMALL_CHUNK)
    parent = await fan_out(dsn, "chunk.fail", 180)
    async with await JobsClient.connect(dsn) as client:
        kids = [UUID(str(r[0])) for r in query(dsn, "SELECT id FROM taskq.jobs WHERE queue = 'kids' "
                                                    "ORDER BY id DESC LIMIT 3")]
        for kid in kids:  # grandchildren of children the parent's own chunk does not reach
            await client.enqueue("chunk.ok", 0, depends_on=[kid], queue="grandkids")
    async with running_worker(dsn, registry()):
        await wait_for(lambda: counts(dsn, "kids").get("cancelled") == 180
                       and counts(dsn, "grandkids").get("cancelled") == 3, timeout=60)
    assert settled_in_parents_transaction(dsn, parent, "kids") == SMALL_CHUNK
    assert query(dsn, "SELECT DISTINCT error_class, cancel_reason FROM taskq.jobs WHERE queue = 'kids'") == [
        ("ParentFailed", "parent-failure:failed")]
    assert query(dsn, "SELECT DISTINCT cancel_reason FROM taskq.jobs WHERE queue = 'grandkids'") == [
        ("parent-failure:cancelled",)]
    assert backlog(dsn) == 0
    assert await violations(dsn) == []


async def test_with_no_worker_the_backlog_waits_and_the_next_worker_start_settles_it(dsn: str) -> None:
    set_chunk(dsn, SMALL_CHUNK)
    parent = await fan_out(dsn, "chunk.ok", 120, mode="on_any_terminal")
    async with await JobsClient.connect(dsn) as client:
        await client.cancel(parent)  # a terminal write with no worker running
    assert counts(dsn, "kids") == {"pending": SMALL_CHUNK, "awaiting_parents": 120 - SMALL_CHUNK}
    # what the parent's transaction left, in slices of at most one chunk
    assert query(dsn, "SELECT parent_id, count(*) FROM taskq.dependency_backlog GROUP BY 1") == [(parent, 2)]
    assert await violations(dsn) == []  # the lag is allowed: the parent is in the backlog
    # without the backlog row the same rows are violations (the allowance is the backlog row, nothing else)
    query(dsn, "CREATE TABLE kept AS SELECT * FROM taskq.dependency_backlog")
    query(dsn, "DELETE FROM taskq.dependency_backlog")
    found = {v.invariant for v in await violations(dsn)}
    assert {"inv_awaiting_parents_settled", "inv_parents_remaining_matches_edges"} <= found, found
    query(dsn, "INSERT INTO taskq.dependency_backlog OVERRIDING SYSTEM VALUE SELECT * FROM kept")
    async with running_worker(dsn, registry(), queues=["elsewhere"]):
        await wait_for(lambda: counts(dsn, "kids") == {"pending": 120}, timeout=30)
    assert backlog(dsn) == 0
    assert await violations(dsn) == []


async def test_resolving_the_same_edges_twice_at_once_counts_them_once(dsn: str) -> None:
    set_chunk(dsn, SMALL_CHUNK)
    async with await JobsClient.connect(dsn) as client:
        big = await client.enqueue("chunk.ok", 1, queue="parents")
        other = await client.enqueue("chunk.ok", 2, queue="parents")
        await client.enqueue_many("chunk.ok", list(range(SMALL_CHUNK * 2)), depends_on=[big, other],
                                  dependency_mode="on_any_terminal", queue="kids")
        await client.cancel(big.job_id)
    # the parent's transaction resolved one chunk; two resolvers now race over the rest of the same parent
    # (the backlog's SKIP LOCKED would keep two resolvers apart: call the settle itself, twice at once)
    step = "SELECT taskq.settle_frontier(ARRAY[%s]::uuid[], ARRAY['cancelled'], 1000)"
    first = psycopg.connect(dsn)
    try:
        assert first.execute(step, (big.job_id,)).fetchone() == (SMALL_CHUNK,)
        second: list[Any] = []

        def race() -> None:
            with psycopg.connect(dsn) as conn:
                second.append(conn.execute(step, (big.job_id,)).fetchone())

        thread = threading.Thread(target=race)
        thread.start()
        await wait_for(lambda: query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                          "AND query LIKE %s", "%settle_frontier%")[0][0] == 1)
        first.commit()
        await asyncio.to_thread(thread.join, 30)
        assert second == [(0,)]  # every edge it waited for was resolved by the first: nothing counted again
    finally:
        first.close()
    assert query(dsn, "SELECT status, parents_remaining, count(*) FROM taskq.jobs WHERE queue = 'kids' "
                      "GROUP BY 1, 2") == [("awaiting_parents", 1, SMALL_CHUNK * 2)]
    assert query(dsn, "SELECT count(*) FROM taskq.job_dependencies WHERE parent_id = %s "
                      "AND resolved_at IS NULL", big.job_id) == [(0,)]
    async with await JobsClient.connect(dsn) as client:
        await client.cancel(other.job_id)
    async with running_worker(dsn, registry(), queues=["elsewhere"]):
        await wait_for(lambda: counts(dsn, "kids") == {"pending": SMALL_CHUNK * 2} and backlog(dsn) == 0)
    assert await violations(dsn) == []


async def test_one_statement_finishing_several_parents_updates_their_child_once(dsn: str) -> None:
    async with await JobsClient.connect(dsn) as client:
        parents = [await client.enqueue("chunk.ok", i, queue="parents") for i in range(5)]
        child = await client.enqueue("chunk.ok", -1, depends_on=parents, dependency_mode="on_any_terminal",
                                     queue="kids")
        ((before,),) = query(dsn, "SELECT revision FROM taskq.jobs WHERE id = %s", child.job_id)
        done = await client.cancel_where(JobFilter(queues=("parents",)))  # one statement, five terminal writes
        assert (done.total, done.batches) == (5, 1)
    assert query(dsn, "SELECT status, parents_remaining, revision - %s FROM taskq.jobs WHERE id = %s",
                 before, child.job_id) == [("pending", 0, 1)]
    assert query(dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s AND from_status = "
                      "'awaiting_parents'", child.job_id) == [(1,)]
    assert await violations(dsn) == []
