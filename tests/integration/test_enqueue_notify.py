"""The enqueue NOTIFY: one per job at light load, coalesced in a burst, and never missing after the last job."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from testkit import running_worker, wait_for

from taskq import JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import JOBS_CHANNEL

pytestmark = pytest.mark.timeout(60)


class Notes:
    """Every NOTIFY on the jobs channel, with the time it arrived."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.task: asyncio.Task[None] | None = None


@pytest.fixture
async def notes(dsn: str) -> AsyncIterator[Notes]:
    seen = Notes()
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(f"LISTEN {JOBS_CHANNEL}")

    async def listen() -> None:
        async for note in conn.notifies():
            if note.payload == "default":
                seen.at.append(time.monotonic())

    seen.task = asyncio.get_running_loop().create_task(listen())
    try:
        yield seen
    finally:
        seen.task.cancel()
        await asyncio.gather(seen.task, return_exceptions=True)
        await conn.close()


async def test_jobs_further_apart_than_the_window_each_notify_in_their_own_insert(
    client: JobsClient, notes: Notes
) -> None:
    client.backend.notifier.window = 0.05
    for i in range(5):
        await client.enqueue("tests.notify.job", i)
        await wait_for(lambda i=i: len(notes.at) == i + 1)
        await asyncio.sleep(0.06)  # the window passes: that is the behaviour under test
    assert len(notes.at) == 5


async def test_a_burst_notifies_once_inline_and_once_after_its_last_commit(
    client: JobsClient, notes: Notes
) -> None:
    # a window longer than the burst takes even on a loaded machine: every job after the first is inside it
    client.backend.notifier.window = 3.0
    await client.enqueue("tests.notify.job", 0)
    await client.enqueue_many("tests.notify.job", list(range(1, 11)))
    for i in range(11, 31):
        await client.enqueue("tests.notify.job", i)
    last_commit = time.monotonic()
    await wait_for(lambda: len(notes.at) >= 2, timeout=10)
    assert len(notes.at) == 2, f"{len(notes.at)} NOTIFYs for 31 jobs"
    assert notes.at[1] >= last_commit, "the trailing NOTIFY came before the burst's last commit"


async def test_enqueues_in_the_callers_transaction_always_notify_in_it(dsn: str, client: JobsClient,
                                                                      notes: Notes) -> None:
    client.backend.notifier.window = 3.0
    await client.enqueue("tests.notify.job", 0)  # opens a window
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await client.enqueue("tests.notify.job", 1, connection=conn)
        await conn.commit()
    await wait_for(lambda: len(notes.at) == 2, timeout=5)  # the second without waiting for the window


async def test_closing_the_client_sends_the_notify_still_waiting(dsn: str, notes: Notes) -> None:
    client = await JobsClient.connect(dsn)
    client.backend.notifier.window = 30.0
    await client.enqueue("tests.notify.job", 0)
    await client.enqueue("tests.notify.job", 1)
    await client.close()
    await wait_for(lambda: len(notes.at) == 2, timeout=5)


async def test_a_worker_with_no_polling_runs_every_job_of_bursts_from_concurrent_producers(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="tests.notify.count", registry=reg)
    async def count(payload: int) -> int:
        return payload

    async def produce(client: JobsClient, base: int) -> list[Any]:
        return [await client.enqueue(count, base + i) for i in range(40)]

    clients = [await JobsClient.connect(dsn, registry=reg) for _ in range(4)]
    try:
        # polling every 60 s: a job whose NOTIFY were lost would not run before the test times out
        async with running_worker(dsn, reg, poll_interval=60.0, concurrency=4) as worker:
            await wait_for(worker.listener.connected.is_set)
            handles = [h for hs in await asyncio.gather(*(produce(c, 100 * k) for k, c in enumerate(clients)))
                       for h in hs]
            for handle in handles:
                assert (await handle.wait(timeout=20)).status == "succeeded"
    finally:
        for c in clients:
            await c.close()
