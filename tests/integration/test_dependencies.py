"""Job dependencies (workflows) against a real PostgreSQL and real in-process workers."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import psycopg
import pytest
from pydantic import BaseModel
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFailed, JobsClient, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.exceptions import DependencyInvalid, DependencyNotFound
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = RetryPolicy(base=0.05, jitter=0)


class Total(BaseModel):
    value: int


async def assert_invariants_hold(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


def status_of(dsn: str, job_id: UUID) -> str:
    return str(query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", job_id)[0][0])


def row_of(dsn: str, job_id: UUID) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        row = cur.execute("SELECT * FROM taskq.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def graph_registry() -> tuple[ActorRegistry, dict[str, Any]]:
    reg = ActorRegistry()
    seen: dict[str, Any] = {"order": [], "parents": {}}

    @actor(name="wf.add", registry=reg)
    async def add(payload: int, ctx: JobContext[int]) -> Total:
        parents = await ctx.parent_results()
        seen["parents"][ctx.job_id] = parents
        seen["order"].append(payload)
        return Total(value=payload + sum(p.value for p in parents.values() if isinstance(p, Total)))

    @actor(name="wf.fail", registry=reg, max_attempts=1)
    async def fail(payload: int, ctx: JobContext[int]) -> None:
        raise RuntimeError("parent broke")

    @actor(name="wf.thread", registry=reg, isolation="thread")
    def in_thread(payload: int, ctx: JobContext[int]) -> int:
        parents = ctx.parent_results_sync()
        return payload + sum(p.value for p in parents.values() if isinstance(p, Total))

    return reg, seen


async def test_a_chain_runs_in_order_and_each_link_reads_its_parents_typed_result(dsn: str) -> None:
    reg, seen = graph_registry()
    async with await JobsClient.connect(dsn, registry=reg) as client:
        async with client.workflow() as wf:
            a = wf.enqueue("wf.add", 1)
            b = wf.enqueue("wf.add", 10, depends_on=[a])
            c = wf.enqueue("wf.add", 100, depends_on=[b])
        assert status_of(dsn, b.job_id) == "awaiting_parents"
        assert row_of(dsn, c.job_id)["parents_remaining"] == 1
        async with running_worker(dsn, reg):
            row = await c.handle.wait(timeout=30)
    assert seen["order"] == [1, 10, 100]
    assert seen["parents"][c.job_id] == {b.job_id: Total(value=11)}
    assert row.result == {"value": 111}
    await assert_invariants_hold(dsn)


async def test_a_thread_actor_reads_parent_results_with_the_sync_variant(dsn: str) -> None:
    reg, _ = graph_registry()
    async with await JobsClient.connect(dsn, registry=reg) as client:
        parent = await client.enqueue("wf.add", 5)
        child = await client.enqueue("wf.thread", 1, depends_on=[parent])
        async with running_worker(dsn, reg):
            row = await child.wait(timeout=30)
    assert row.result == 6


@pytest.mark.parametrize("mode", ["on_success", "on_any_terminal"])
async def test_fan_in_with_one_failing_parent(dsn: str, mode: str) -> None:
    reg, seen = graph_registry()
    async with await JobsClient.connect(dsn, registry=reg) as client:
        p1 = await client.enqueue("wf.add", 1)
        p2 = await client.enqueue("wf.fail", 2)
        p3 = await client.enqueue("wf.add", 3)
        child = await client.enqueue("wf.add", 0, depends_on=[p1, p2, p3], dependency_mode=mode)
        async with running_worker(dsn, reg):
            if mode == "on_success":
                with pytest.raises(JobFailed):
                    await child.wait(timeout=30)
            else:
                await child.wait(timeout=30)
        row = await child.refresh()
        if mode == "on_success":
            assert (row.status, row.error_class, row.cancel_reason) == ("cancelled", "ParentFailed",
                                                                        "parent-failure:failed")
            assert row.cancel_requested_at is not None and row.attempt == 0
            events = await client.events(child.job_id)
            assert events[-1].detail["cause"] == "parent-failure:failed"
            assert events[-1].detail["parent_id"] == str(p2.job_id)
        else:
            assert row.status == "succeeded"
            assert seen["parents"][child.job_id] == {p1.job_id: Total(value=1), p2.job_id: None,
                                                     p3.job_id: Total(value=3)}
    await assert_invariants_hold(dsn)


async def test_a_parent_already_failed_at_enqueue_cancels_the_child_at_once(dsn: str) -> None:
    reg, _ = graph_registry()
    async with await JobsClient.connect(dsn, registry=reg) as client:
        parent = await client.enqueue("wf.fail", 1)
        async with running_worker(dsn, reg):
            with pytest.raises(JobFailed):
                await parent.wait(timeout=30)
        child = await client.enqueue("wf.add", 1, depends_on=[parent])
        row = await child.refresh()
        assert (row.status, row.error_class, row.cancel_reason) == ("cancelled", "ParentFailed",
                                                                    "parent-failure:failed")
        later = await client.enqueue("wf.add", 1, depends_on=[parent], dependency_mode="on_any_terminal")
        assert (await later.refresh()).status == "pending"
        grandchild = await client.enqueue("wf.add", 1, depends_on=[child.job_id])
        assert (await grandchild.refresh()).cancel_reason == "parent-failure:cancelled"
    await assert_invariants_hold(dsn)


async def test_a_released_child_is_pending_or_scheduled_by_its_scheduled_at(dsn: str) -> None:
    from datetime import timedelta

    async with await JobsClient.connect(dsn) as client:
        parent = await client.enqueue("wf.any", 1)
        soon = await client.enqueue("wf.any", 1, depends_on=[parent])
        ahead = await client.enqueue("wf.any", 1, depends_on=[parent], scheduled_at=timedelta(hours=1))
        await client.cancel(parent.job_id)  # a cancel of a pending parent: its on_success children cascade
        assert (await soon.refresh()).cancel_reason == "parent-failure:cancelled"
        parent2 = await client.enqueue("wf.any", 1)
        soon2 = await client.enqueue("wf.any", 1, depends_on=[parent2], dependency_mode="on_any_terminal")
        ahead2 = await client.enqueue("wf.any", 1, depends_on=[parent2], dependency_mode="on_any_terminal",
                                      scheduled_at=timedelta(hours=1))
        await client.cancel(parent2.job_id)
        assert (await soon2.refresh()).status == "pending"
        assert (await ahead2.refresh()).status == "scheduled"
        assert (await ahead.refresh()).status == "cancelled"
    await assert_invariants_hold(dsn)


async def test_cancelling_an_awaiting_child_cancels_it_before_start_and_cascades_to_its_dependents(
    dsn: str,
) -> None:
    async with await JobsClient.connect(dsn) as client:
        parent = await client.enqueue("wf.any", 1)
        child = await client.enqueue("wf.any", 1, depends_on=[parent])
        grandchild = await client.enqueue("wf.any", 1, depends_on=[child])
        result = await client.cancel(child.job_id, reason="not needed")
        assert (result.previous_status, result.new_status) == ("awaiting_parents", "cancelled")
        row = await child.refresh()
        assert (row.error_class, row.cancel_reason) == ("CancelledBeforeStart", "not needed")
        g = await grandchild.refresh()
        assert (g.status, g.error_class, g.cancel_reason) == ("cancelled", "ParentFailed", "parent-failure:cancelled")
        assert (await parent.refresh()).status == "pending"
    await assert_invariants_hold(dsn)


async def test_an_operator_cancel_of_the_running_parent_cancels_the_child(dsn: str) -> None:
    reg = ActorRegistry()
    started = asyncio.Event()

    @actor(name="wf.slow", registry=reg)
    async def slow(payload: int, ctx: JobContext[int]) -> None:
        started.set()
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg):
        parent = await client.enqueue(slow, 1)
        child = await client.enqueue("wf.any", 1, depends_on=[parent])
        await asyncio.wait_for(started.wait(), 20)
        await client.cancel(parent.job_id)
        with pytest.raises(JobFailed):
            await child.wait(timeout=30)
        row = await child.refresh()
        assert (row.status, row.cancel_reason) == ("cancelled", "parent-failure:cancelled")
        assert (await parent.refresh()).error_class == "CancelledCooperatively"
    await assert_invariants_hold(dsn)


async def test_requeue_with_cascade_revives_the_children_and_they_succeed(dsn: str) -> None:
    reg = ActorRegistry()
    broken = {"yes": True}

    @actor(name="wf.fixable", registry=reg, max_attempts=1)
    async def fixable(payload: int, ctx: JobContext[int]) -> int:
        if broken["yes"]:
            raise RuntimeError("bug")
        return payload

    @actor(name="wf.sum", registry=reg)
    async def total(payload: int, ctx: JobContext[int]) -> int:
        return payload + sum(v for v in (await ctx.parent_results()).values() if isinstance(v, int))

    async with await JobsClient.connect(dsn, registry=reg) as client:
        async with client.workflow() as wf:
            parent = wf.enqueue(fixable, 7)
            other = wf.enqueue(total, 1)
            child = wf.enqueue(total, 10, depends_on=[parent, other])
            grandchild = wf.enqueue(total, 100, depends_on=[child])
        async with running_worker(dsn, reg):
            with pytest.raises(JobFailed):
                await grandchild.handle.wait(timeout=30)
            assert (await child.handle.refresh()).cancel_reason == "parent-failure:failed"
            plain = await client.requeue(parent.job_id)  # without cascade the children stay cancelled
            assert plain.revived == ()
            with pytest.raises(JobFailed):
                await parent.handle.wait(timeout=30)
            broken["yes"] = False
            result = await client.requeue(parent.job_id, cascade=True, reason="fixed")
            assert set(result.revived) == {child.job_id, grandchild.job_id}
            revived = await child.handle.refresh()
            assert revived.status in ("awaiting_parents", "pending", "running", "succeeded")
            row = await grandchild.handle.wait(timeout=30)
    assert row.result == 100 + 10 + 7 + 1
    await assert_invariants_hold(dsn)


async def test_a_graph_builder_that_raises_midway_writes_nothing(dsn: str) -> None:
    async with await JobsClient.connect(dsn) as client:
        with pytest.raises(RuntimeError, match="midway"):
            async with client.workflow() as wf:
                a = wf.enqueue("wf.any", 1)
                wf.enqueue("wf.any", 2, depends_on=[a])
                raise RuntimeError("midway")
        parent = await client.enqueue("wf.any", 0)
        with pytest.raises(DependencyNotFound):
            async with client.workflow() as wf:
                a = wf.enqueue("wf.any", 1, depends_on=[parent])
                wf.enqueue("wf.any", 2, depends_on=[a, UUID(int=1)])
        assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 1
        assert query(dsn, "SELECT count(*) FROM taskq.job_dependencies")[0][0] == 0
        assert query(dsn, "SELECT has_dependents FROM taskq.jobs")[0][0] is False


async def test_bad_dependencies_are_refused_at_enqueue_and_write_nothing(dsn: str) -> None:
    from taskq.workflows import MAX_PARENTS, GraphJob, enqueue_graph

    async with await JobsClient.connect(dsn) as client:
        with pytest.raises(DependencyNotFound, match="do not exist"):
            await client.enqueue("wf.any", 1, depends_on=[UUID(int=5)])
        with pytest.raises(DependencyInvalid, match="dependency_mode"):
            await client.enqueue("wf.any", 1, depends_on=[UUID(int=5)], dependency_mode="sometimes")
        with pytest.raises(DependencyInvalid, match="limit"):
            await client.enqueue("wf.any", 1, depends_on=[UUID(int=i) for i in range(MAX_PARENTS + 1)])
        with pytest.raises(DependencyInvalid, match="not a job id"):
            await client.enqueue("wf.any", 1, depends_on=["nope"])
        a = client._prepare("wf.any", 1)
        b = client._prepare("wf.any", 2)
        with pytest.raises(DependencyInvalid, match="later job of the same graph"):
            await enqueue_graph(client.backend, [GraphJob(a, (b.id,)), GraphJob(b)])
        with pytest.raises(DependencyInvalid, match="itself"):
            await enqueue_graph(client.backend, [GraphJob(a, (a.id,))])
        async with client.workflow() as other:
            foreign = other.enqueue("wf.any", 1)
            with pytest.raises(DependencyInvalid, match="another workflow"):
                async with client.workflow() as wf:
                    wf.enqueue("wf.any", 1, depends_on=[foreign])
        assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 1  # `foreign`, written on its own


async def test_enqueue_many_shares_its_parents_and_a_fan_out_is_released_in_one_transaction(dsn: str) -> None:
    async with await JobsClient.connect(dsn) as client:
        parent = await client.enqueue("wf.any", 0)
        children = await client.enqueue_many("wf.any", list(range(500)), depends_on=[parent], chunk_size=200)
        assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'awaiting_parents'")[0][0] == 500
        await client.cancel(parent.job_id)
        assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE cancel_reason = 'parent-failure:cancelled'"
                     )[0][0] == 500
        assert len(children) == 500
        edges = await client.dependencies(parent.job_id)
        assert {e.side for e in edges} == {"child"} and len(edges) == 500
        assert {e.parent_status for e in edges} == {"cancelled"}
    await assert_invariants_hold(dsn)


async def test_a_chain_of_a_thousand_cancels_in_one_trigger_call_without_recursion(dsn: str) -> None:
    async with await JobsClient.connect(dsn) as client:
        async with client.workflow() as wf:
            prev = wf.enqueue("wf.any", 0)
            first = prev
            for i in range(1, 1000):
                prev = wf.enqueue("wf.any", i, depends_on=[prev])
        await client.cancel(first.job_id)
        # the cancel's own transaction goes one chunk (500 edges, one per generation) down the chain, without
        # recursion, and leaves the rest to the backlog (migration 11); resolver steps finish it
        assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE error_class = 'ParentFailed'")[0][0] == 500
        await assert_invariants_hold(dsn)
        while query(dsn, "SELECT taskq.settle_backlog(1)")[0][0]:
            pass
        assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE error_class = 'ParentFailed'")[0][0] == 999
    await assert_invariants_hold(dsn)


async def test_retention_keeps_a_parent_that_a_waiting_child_depends_on_and_prunes_past_it(dsn: str) -> None:
    from taskq.models import PruneClass
    from taskq.ops.retention import prune

    async with await JobsClient.connect(dsn) as client:
        parent = await client.enqueue("wf.any", 1, queue="nobody")
        other = await client.enqueue("wf.any", 2, queue="nobody")
        child = await client.enqueue("wf.any", 3, depends_on=[parent, other], queue="nobody")
        plain = await client.enqueue("wf.any", 4, queue="nobody")
        # the protected parent is the oldest finished row: a batch of one must pass over it, not stall
        query(dsn, "UPDATE taskq.jobs SET status = 'succeeded', finished_at = now() - interval '10 days' "
                   "WHERE id = %s", parent.job_id)
        query(dsn, "UPDATE taskq.jobs SET status = 'succeeded', finished_at = now() - interval '9 days' "
                   "WHERE id = %s", plain.job_id)
        assert status_of(dsn, child.job_id) == "awaiting_parents"
        keep = {PruneClass.SUCCEEDED: 3600.0, PruneClass.FAILED: 3600.0, PruneClass.ATTEMPTS: 0.0}
        result = await prune(client.backend, keep, batch_size=1, pause_ratio=0)
        assert result.succeeded == 1
        assert query(dsn, "SELECT id FROM taskq.jobs WHERE id = %s", plain.job_id) == []
        (deleted,) = query(dsn, "SELECT jobs FROM taskq.delete_terminal_jobs(%s)", [parent.job_id])
        assert deleted == (0,)  # the owner function keeps it too, whatever ids it is given
        await client.cancel(child.job_id)
        assert (await prune(client.backend, keep, batch_size=1, pause_ratio=0)).succeeded == 1  # the parent now
        assert query(dsn, "SELECT parent_id FROM taskq.job_dependencies") == [(other.job_id,)]  # its edge went


async def test_a_parent_ending_while_its_childs_enqueue_commits_never_strands_the_child(dsn: str) -> None:
    """200 rounds of the fan-in race of the prior art (a parent's terminal write against the enqueue of
    its child): free races, the enqueue holding its transaction open while the parent's write waits, and
    the parent's write holding its transaction open while the enqueue waits. No child is left waiting."""
    from taskq import sql as queries

    async with await JobsClient.connect(dsn, max_size=4) as client, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as raw:
        children: list[tuple[UUID, str]] = []
        for i in range(200):
            mode = ("on_success", "on_any_terminal")[i % 2]
            parent = await client.enqueue("race.parent", i, queue="nobody")
            order = i % 3
            if order == 0:  # free race
                _, child = await asyncio.gather(
                    client.cancel(parent.job_id),
                    client.enqueue("race.child", i, depends_on=[parent], dependency_mode=mode, queue="nobody"),
                )
            elif order == 1:  # the enqueue holds the parent's lock; the parent's terminal write waits for it
                async with raw.transaction():
                    child = await client.enqueue("race.child", i, depends_on=[parent], dependency_mode=mode,
                                                 queue="nobody", connection=raw)
                    cancel = asyncio.ensure_future(client.cancel(parent.job_id))
                    await asyncio.sleep(0)
                    await wait_for(lambda: _waiting_on_a_lock(dsn))
                await cancel
            else:  # the parent's terminal write commits while the enqueue waits on its row lock
                async with raw.transaction():
                    await raw.execute(queries.query("job_cancel_request"), {"id": parent.job_id, "reason": None})
                    enqueue = asyncio.ensure_future(client.enqueue(
                        "race.child", i, depends_on=[parent], dependency_mode=mode, queue="nobody"))
                    await wait_for(lambda: _waiting_on_a_lock(dsn))
                child = await enqueue
            children.append((child.job_id, mode))
        rows = dict(query(dsn, "SELECT id, status || ':' || coalesce(cancel_reason, '') FROM taskq.jobs "
                               "WHERE actor = 'race.child'"))
    for job_id, mode in children:
        expected = "cancelled:parent-failure:cancelled" if mode == "on_success" else "pending:"
        assert rows[job_id] == expected, (job_id, mode, rows[job_id])
    await assert_invariants_hold(dsn)


def _waiting_on_a_lock(dsn: str) -> bool:
    return bool(query(dsn, "SELECT 1 FROM pg_stat_activity "
                           "WHERE wait_event_type = 'Lock' AND datname = current_database()"))


def test_the_sync_client_enqueues_graphs_requeues_with_cascade_and_reads_the_edges(dsn: str) -> None:
    from taskq import SyncJobsClient

    with SyncJobsClient.connect(dsn) as client:
        with client.workflow() as wf:
            a = wf.enqueue("wf.any", 1, queue="nobody")
            b = wf.enqueue("wf.any", 2, depends_on=[a], queue="nobody")
        c = client.enqueue("wf.any", 3, depends_on=[b.handle], queue="nobody")
        fan = client.enqueue_many("wf.any", [4, 5], depends_on=[a.job_id], queue="nobody")
        assert status_of(dsn, c.job_id) == "awaiting_parents" and len(fan) == 2
        with pytest.raises(DependencyNotFound):
            client.enqueue("wf.any", 6, depends_on=[UUID(int=9)])
        query(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", a.job_id)
        assert status_of(dsn, c.job_id) == "cancelled"
        result = client.requeue(a.job_id, cascade=True)
        assert set(result.revived) == {b.job_id, c.job_id, *(h.job_id for h in fan)}
        assert {e.job_id for e in client.dependencies(a.job_id)} == {b.job_id, *(h.job_id for h in fan)}
        with pytest.raises(RuntimeError, match="midway"), client.workflow() as wf:
            wf.enqueue("wf.any", 7)
            raise RuntimeError("midway")
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 5
