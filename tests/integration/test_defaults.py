"""Out-of-the-box worker settings and how claims refill slots (issue 13): the default concurrency for the
APP's actors, and a slot freed as soon as its actor returned, while the outcome is still being written."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.settings import DEFAULT_CONCURRENCY, WorkerSettings

pytestmark = pytest.mark.timeout(60)


def registry_of(*isolations: str) -> ActorRegistry:
    reg = ActorRegistry()
    for i, isolation in enumerate(isolations):
        if isolation == "async":
            async def fn_async(payload: int) -> int:
                return payload

            actor(name=f"tests.defaults.a{i}", registry=reg)(fn_async)
        else:
            def fn_sync(payload: int) -> int:
                return payload

            actor(name=f"tests.defaults.s{i}", registry=reg, isolation=isolation)(fn_sync)  # type: ignore[call-overload]
    return reg


def test_unset_concurrency_is_the_default_whatever_the_other_actors_and_each_class_has_its_own_capacity() -> None:
    s = WorkerSettings(max_threads=16, max_children=3)
    assert s.concurrency is None
    assert s.resolved_concurrency() == DEFAULT_CONCURRENCY == 200
    assert s.capacities() == {"async": 200, "thread": 16, "process": 3}


def test_a_concurrency_that_is_set_is_the_async_capacity_and_leaves_the_others_alone() -> None:
    assert WorkerSettings(concurrency=7).resolved_concurrency() == 7
    assert WorkerSettings(concurrency=40, max_threads=4, max_children=2).capacities() == {
        "async": 40, "thread": 4, "process": 2}


@pytest.mark.parametrize(("isolations", "expected"), [(("async",), 200), (("async", "thread"), 200)])
async def test_a_worker_with_default_settings_registers_the_concurrency_it_runs_with(
    dsn: str, isolations: tuple[str, ...], expected: int
) -> None:
    async with running_worker(dsn, registry_of(*isolations), max_threads=4) as worker:
        assert worker.concurrency == expected
        rows = query(dsn, "SELECT concurrency FROM taskq.workers WHERE id = %s", worker.worker_id)
        assert rows == [(expected,)]


async def test_a_slot_frees_when_its_actor_returns_while_the_outcome_is_still_being_written(
    dsn: str, client: JobsClient
) -> None:
    """concurrency 1: the first job's terminal write is held up by a row lock; the worker claims and runs
    the second job meanwhile, but holds no third one (at most `concurrency` outcomes wait unwritten)."""
    reg = ActorRegistry()
    release_first = asyncio.Event()
    started: list[int] = []

    @actor(name="tests.defaults.step", registry=reg)
    async def step(payload: int) -> int:
        started.append(payload)
        if payload == 1:
            await release_first.wait()
        return payload

    async with running_worker(dsn, reg, concurrency=1, poll_interval=0.05) as worker:
        first = await client.enqueue(step, 1)
        await wait_for(lambda: started == [1])
        blocker = await psycopg.AsyncConnection.connect(dsn)
        try:
            # the worker's finish statement for the first job waits on this lock
            await blocker.execute("SELECT 1 FROM taskq.jobs WHERE id = %s FOR UPDATE", (first.job_id,))
            release_first.set()
            await wait_for(lambda: worker.parts.completer.outstanding == 1)
            second = await client.enqueue(step, 2)
            await wait_for(lambda: started == [1, 2])
            # the second outcome queues behind the first: two unwritten outcomes, no free slot left
            await wait_for(lambda: worker.parts.completer.outstanding == 2)
            third = await client.enqueue(step, 3)
            assert worker.parts.dispatcher.free_slots() == {"async": 0}
            assert status_of(dsn, first.job_id) == "running"
            assert status_of(dsn, third.job_id) == "pending"
            assert started == [1, 2]
        finally:
            await blocker.rollback()
            await blocker.close()
        for handle in (first, second, third):
            assert (await handle.wait(timeout=10)).status.value == "succeeded"
    rows = query(dsn, "SELECT count(*), count(DISTINCT job_id) FROM taskq.job_attempts WHERE outcome = 'succeeded'")
    assert rows == [(3, 3)]


def status_of(dsn: str, job_id: UUID) -> Any:
    return query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", job_id)[0][0]
