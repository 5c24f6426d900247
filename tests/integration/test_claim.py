"""The worker's claim statement against a real PostgreSQL: what it takes, and how PostgreSQL plans it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import pytest
from prometheus_client import REGISTRY
from testkit import running_worker, wait_for

from taskq import JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import Backend
from taskq.backend.workers import WorkerStore

pytestmark = pytest.mark.timeout(60)

ROUNDS = 12
"""Claims on one connection: psycopg prepares the statement at the 5th, PostgreSQL plans the first five
executions of a prepared statement for their parameters and only then may keep a generic plan."""


@pytest.fixture
async def store(dsn: str) -> AsyncIterator[WorkerStore]:
    """A worker store on a pool of one connection, so that every claim runs on the same session."""
    backend = await Backend.open(dsn, min_size=1, max_size=1)
    try:
        yield WorkerStore(backend, "w-claim")
    finally:
        await backend.close()


async def claim_plans(store: WorkerStore) -> tuple[int, int]:
    """(generic, custom) plans PostgreSQL made for the claim statement prepared on the store's connection."""
    async with store.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE '%%INSERT INTO taskq.job_attempts%%'"
        )
        row = await cur.fetchone()
    assert row is not None, "the claim statement was never prepared"
    return int(row[0]), int(row[1])


@pytest.mark.parametrize("queues", [["default"], ["a", "b", "c"]])
async def test_a_claim_on_a_short_queue_keeps_a_generic_plan(
    store: WorkerStore, client: JobsClient, queues: list[str]
) -> None:
    # planning the claim costs more than running it on a short queue: a claim planned every time
    # (all custom plans) puts 0.15-0.35 ms back on every job's enqueue -> start latency
    for i in range(ROUNDS):
        await client.enqueue("tests.claim.job", i, queue=queues[i % len(queues)])
        assert len(await store.claim(queues, 1, 60.0)) == 1
    generic, custom = await claim_plans(store)
    assert generic > 0, f"the claim is planned on every call ({custom} custom plans, no generic one)"


async def test_a_claim_over_several_queues_takes_the_most_urgent_jobs_of_all_of_them(
    store: WorkerStore, client: JobsClient
) -> None:
    # a queue named twice must not push another out of the claim: the list is deduplicated before
    # the (planner-only) LIMIT on it; every round runs on one connection, so the later ones use the
    # generic plan
    queues = ["a", "b", "b", "c"]
    for i in range(ROUNDS):
        urgent: dict[UUID, tuple[int, str]] = {}
        for queue, priority in (("a", 5), ("b", 3), ("c", 1), ("c", 4)):
            handle = await client.enqueue("tests.claim.job", i, queue=queue, priority=priority)
            urgent[handle.job_id] = (priority, queue)
        claimed = await store.claim(queues, 3, 60.0)
        assert [urgent[job.id] for job in claimed] == [(1, "c"), (3, "b"), (4, "c")]
        assert len(await store.claim(queues, 10, 60.0)) == 1  # the rest: queue a's job
    assert (await claim_plans(store))[0] > 0


async def test_claimed_jobs_are_counted_per_queue(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="tests.claim.count", queue="counted", registry=reg)
    async def count(payload: int) -> int:
        return payload

    def claimed() -> float:
        return REGISTRY.get_sample_value("taskq_jobs_claimed_total", {"queue": "counted"}) or 0.0

    before = claimed()
    async with running_worker(dsn, reg, queues=["counted"]):
        handles = await client.enqueue_many(count, [1, 2, 3], queue="counted")
        for handle in handles:
            await handle.wait(timeout=10)
    assert claimed() - before == 3


async def test_a_finished_job_does_not_send_an_idle_worker_claiming_an_empty_queue(
    dsn: str, client: JobsClient
) -> None:
    """A freed slot wakes the dispatcher only when it was waiting for a slot: jobs enqueued one at a time,
    each finished before the next, find the worker idle, and it claims each one on its NOTIFY without an
    empty claim after the job. A full worker still claims the moment a slot frees."""
    reg = ActorRegistry()

    @actor(name="tests.claim.one", registry=reg)
    async def one(payload: int) -> int:
        return payload

    async with running_worker(dsn, reg, poll_interval=30.0) as worker:
        # the listener's first connect wakes the dispatcher once (for jobs enqueued while it was away):
        # let that claim happen, then let a warm-up job's NOTIFY land, before counting
        await wait_for(worker.parts.listener.connected.is_set)
        await (await client.enqueue(one, -1)).wait(timeout=10)
        empty_claims = 0
        claim = worker.parts.store.claim

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal empty_claims
            jobs = await claim(*args, **kwargs)
            empty_claims += not jobs
            return jobs

        worker.parts.store.claim = counted  # type: ignore[method-assign]
        for i in range(10):
            await (await client.enqueue(one, i)).wait(timeout=10)
        # a freed slot that woke the idle dispatcher would cost one empty claim per job (10 here); what
        # timing can add is at most the warm-up job's own NOTIFY, if it was claimed by the startup wake
        assert empty_claims <= 1, f"{empty_claims} empty claims for 10 jobs"
    async with running_worker(dsn, reg, poll_interval=30.0, concurrency=1):
        handles = await client.enqueue_many(one, list(range(5)))
        for handle in handles:
            assert (await handle.wait(timeout=10)).result is not None
