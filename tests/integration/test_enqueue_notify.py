"""The enqueue NOTIFY: sent after the insert commits, one per job at light load, coalesced in a burst, never
missing after the last job, and in the caller's own transaction only when that transaction commits."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from testkit import running_worker, wait_for, wait_until

from taskq import JobsClient, SyncJobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import JOBS_CHANNEL

pytestmark = pytest.mark.timeout(60)


class Notes:
    """Every NOTIFY for queue `default` on the jobs channel, with the time it arrived; and every payload
    in the order of arrival (a test's own markers among them)."""

    def __init__(self) -> None:
        self.at: list[float] = []
        self.payloads: list[str] = []
        self.task: asyncio.Task[None] | None = None

    async def mark(self, dsn: str, marker: str) -> None:
        """Send `marker` on the channel from a connection of its own, and wait until it has arrived: every
        notification committed before it has arrived before it (PostgreSQL delivers in commit order)."""
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("SELECT pg_notify(%s, %s)", (JOBS_CHANNEL, marker))
        await wait_for(lambda: marker in self.payloads, timeout=5)

    def before(self, marker: str) -> int:
        """How many NOTIFYs of queue `default` arrived before `marker`."""
        return self.payloads[: self.payloads.index(marker)].count("default")


@pytest.fixture
async def notes(dsn: str) -> AsyncIterator[Notes]:
    seen = Notes()
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await conn.execute(f"LISTEN {JOBS_CHANNEL}")

    async def listen() -> None:
        async for note in conn.notifies():
            seen.payloads.append(note.payload)
            if note.payload == "default":
                seen.at.append(time.monotonic())

    seen.task = asyncio.get_running_loop().create_task(listen())
    try:
        yield seen
    finally:
        seen.task.cancel()
        await asyncio.gather(seen.task, return_exceptions=True)
        await conn.close()


async def test_one_enqueue_is_followed_by_its_notify(client: JobsClient, notes: Notes) -> None:
    await client.enqueue("tests.notify.job", 0)
    await wait_for(lambda: len(notes.at) == 1, timeout=5)


async def test_one_enqueue_many_is_followed_by_its_notify(client: JobsClient, notes: Notes) -> None:
    await client.enqueue_many("tests.notify.job", list(range(10)))
    await wait_for(lambda: len(notes.at) == 1, timeout=5)


async def test_a_busy_queues_insert_does_not_notify_in_its_own_transaction(
    dsn: str, client: JobsClient, notes: Notes
) -> None:
    """Under load the NOTIFY is a transaction of its own after the insert's commit (so PostgreSQL's notify
    lock is not held through the insert's WAL flush): the second job within the window is committed and
    visible, its enqueue has returned, and no notification of it has come; the trailing one follows."""
    client.backend.notifier.window = 3.0  # longer than the two enqueues take even on a loaded machine
    await client.enqueue("tests.notify.job", 0)  # a quiet queue: its insert notifies (the test below)
    await wait_for(lambda: len(notes.at) == 1, timeout=5)
    await client.enqueue("tests.notify.job", 1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'pending'")
        assert await cur.fetchone() == (2,)
    await notes.mark(dsn, "committed")
    assert notes.before("committed") == 1, "the busy queue's insert notified in its own transaction"
    await wait_for(lambda: len(notes.at) == 2, timeout=10)


async def test_a_quiet_queues_insert_carries_its_notify_with_no_second_statement(
    client: JobsClient, notes: Notes
) -> None:
    """At light load (no job of the queue from this process within the window) the insert notifies in its
    own transaction, delivered with its commit: neither the NOTIFY after the commit nor the trailing one
    is sent (both would cost the light-load enqueue -> start a statement)."""
    notifier = client.backend.notifier

    async def second_statement(conn: Any, queue: str) -> None:
        raise AssertionError("a quiet queue's NOTIFY went as a statement after the insert")

    def trailing(queue: str) -> None:
        raise AssertionError("a quiet queue's NOTIFY was left to the trailing sender")

    notifier.send_on = second_statement  # type: ignore[method-assign]
    notifier.after_commit = trailing  # type: ignore[method-assign]
    await client.enqueue("tests.notify.job", 0)
    await wait_for(lambda: len(notes.at) == 1, timeout=5)
    notifier.window = 0.0  # the next one is quiet again at once
    await client.enqueue_many("tests.notify.job", [1, 2, 3])
    await wait_for(lambda: len(notes.at) == 2, timeout=5)


def _sync_notifications(dsn: str, enqueue: Any) -> list[str]:
    """LISTEN on a real connection, run `enqueue` (a sync client's), and collect what arrives within 5 s
    of it, stopping at the first NOTIFY of queue `default`."""
    got: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"LISTEN {JOBS_CHANNEL}")
        enqueue()
        deadline = time.monotonic() + 5
        while "default" not in got and time.monotonic() < deadline:
            for note in conn.notifies(timeout=max(0.01, deadline - time.monotonic()), stop_after=1):
                got.append(note.payload)
    return got


async def test_the_sync_client_enqueue_and_enqueue_many_are_each_followed_by_their_notify(dsn: str) -> None:
    def check() -> None:
        with SyncJobsClient.connect(dsn) as client:
            assert "default" in _sync_notifications(dsn, lambda: client.enqueue("tests.notify.job", 0))
            client.backend.notifier.window = 0.0  # the next NOTIFY need not wait for this one's window
            assert "default" in _sync_notifications(
                dsn, lambda: client.enqueue_many("tests.notify.job", list(range(10))))

    await asyncio.to_thread(check)


async def test_a_sync_client_burst_notifies_at_once_and_after_its_last_commit(dsn: str, notes: Notes) -> None:
    def burst() -> float:
        with SyncJobsClient.connect(dsn) as client:
            client.backend.notifier.window = 3.0  # longer than the burst takes even on a loaded machine
            for i in range(20):
                client.enqueue("tests.notify.job", i)
            last_commit = time.monotonic()
            time.sleep(0)  # nothing waits here: close() must not drop the trailing NOTIFY either way
            return last_commit

    last_commit = await asyncio.to_thread(burst)
    await wait_for(lambda: len(notes.at) >= 2, timeout=10)
    await notes.mark(dsn, "after")
    assert notes.before("after") == 2, f"{notes.before('after')} NOTIFYs for 20 jobs"
    assert notes.at[1] >= last_commit, "the trailing NOTIFY came before the burst's last commit"


def _child_burst(client: SyncJobsClient) -> None:
    client.enqueue("tests.notify.job", 10)  # the child's first of its window: at once
    client.enqueue("tests.notify.job", 11)  # within it: the child's own trailing NOTIFY, sent at its close
    client.close()


async def test_a_forked_child_of_a_sync_client_sends_its_own_notifies(dsn: str, notes: Notes) -> None:
    """The parent has a trailing NOTIFY pending when it forks; the child's burst must not count on it (the
    parent's thread does not exist in the child): 2 NOTIFYs from each process."""
    def run() -> int | None:
        with SyncJobsClient.connect(dsn) as client:
            client.backend.notifier.window = 30.0
            client.enqueue("tests.notify.job", 0)
            client.enqueue("tests.notify.job", 1)  # pending in the parent until its close
            pid = os.fork()
            if pid == 0:  # the child: no pytest machinery after this, only an exit status
                code = 1
                try:
                    _child_burst(client)
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            return os.waitstatus_to_exitcode(status)

    assert await asyncio.to_thread(run) == 0
    await wait_for(lambda: len(notes.at) >= 4, timeout=10)
    await notes.mark(dsn, "after")
    assert notes.before("after") == 4


async def test_the_callers_transaction_notifies_when_it_commits_and_not_before(
    dsn: str, client: JobsClient, notes: Notes
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await client.enqueue("tests.notify.job", 1, connection=conn)
        await client.enqueue_many("tests.notify.job", [2, 3], connection=conn)
        await client.backend.notifier.flush()  # a NOTIFY wrongly left to the client would go now
        await notes.mark(dsn, "before-commit")
        assert notes.before("before-commit") == 0, "a notification came before the caller committed"
        await conn.commit()
    await wait_for(lambda: len(notes.at) >= 1, timeout=5)
    await client.backend.notifier.flush()
    await notes.mark(dsn, "after-commit")
    # one transaction: PostgreSQL folds its identical notifications into one
    assert notes.before("after-commit") == 1


async def test_jobs_further_apart_than_the_window_each_get_their_own_notify(
    client: JobsClient, notes: Notes
) -> None:
    client.backend.notifier.window = 0.05
    for i in range(5):
        await client.enqueue("tests.notify.job", i)
        await wait_for(lambda i=i: len(notes.at) == i + 1)
        await asyncio.sleep(0.06)  # the window passes: that is the behaviour under test
    assert len(notes.at) == 5


async def test_a_burst_notifies_at_once_and_once_after_its_last_commit(
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


async def test_enqueues_in_the_callers_transaction_notify_in_it_whatever_the_window(
    dsn: str, client: JobsClient, notes: Notes
) -> None:
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
            await wait_for(worker.parts.listener.connected.is_set)
            handles = [h for hs in await asyncio.gather(*(produce(c, 100 * k) for k, c in enumerate(clients)))
                       for h in hs]
            for handle in handles:
                assert (await handle.wait(timeout=20)).status == "succeeded"
    finally:
        for c in clients:
            await c.close()


def _gaps(at: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(at)]


async def test_a_queue_kept_busy_sends_its_notifies_further_and_further_apart(
    dsn: str, client: JobsClient, notes: Notes
) -> None:
    """One process enqueueing without pause (every 50 ms, against a window of 0.5 s): each NOTIFY doubles the
    window, up to max_window (2 s), so the jobs enqueued until the third NOTIFY has come, and one after it,
    get 4 NOTIFYs (at 0, 0.5, 1.5 and 3.5 s), not one per 0.5 s. A NOTIFY can go late, never early: the gaps
    are lower bounds. The producer stops on the third NOTIFY, not on the clock: a loaded machine that sent
    the second and third late would otherwise have no job left to enqueue after the third."""
    client.backend.notifier.window = 0.5
    client.backend.notifier.pacing.max_window = 2.0
    start = time.monotonic()
    i = 0
    while len(notes.at) < 3:
        assert time.monotonic() - start < 30, f"{len(notes.at)} NOTIFYs after 30 s of jobs"
        await client.enqueue("tests.notify.job", i)
        i += 1
        await asyncio.sleep(0.05)
    await client.enqueue("tests.notify.job", i)  # its NOTIFY is the fourth, one widest window after the third
    await wait_for(lambda: len(notes.at) >= 4, timeout=10)
    await notes.mark(dsn, "after")
    assert notes.before("after") == 4, f"{notes.before('after')} NOTIFYs, {_gaps(notes.at)} apart"
    gaps = _gaps(notes.at)
    assert gaps[0] > 0.4 and gaps[1] > 0.9 and gaps[2] > 1.9, f"NOTIFYs {gaps} apart"


async def test_a_sync_clients_busy_queue_sends_its_notifies_further_and_further_apart(dsn: str, notes: Notes) -> None:
    def busy() -> None:  # as the async test above: jobs until the third NOTIFY, and one after it
        with SyncJobsClient.connect(dsn) as client:
            client.backend.notifier.window = 0.5
            client.backend.notifier.pacing.max_window = 2.0
            start = time.monotonic()
            i = 0
            while len(notes.at) < 3:
                assert time.monotonic() - start < 30, f"{len(notes.at)} NOTIFYs after 30 s of jobs"
                client.enqueue("tests.notify.job", i)
                i += 1
                time.sleep(0.05)
            client.enqueue("tests.notify.job", i)
            # the trailing NOTIFY, due one widest window after the third, goes from the client's thread
            # before close() (which would send it at once)
            wait_until(lambda: len(notes.at) >= 4, timeout=10)

    await asyncio.to_thread(busy)
    await wait_for(lambda: len(notes.at) >= 4, timeout=10)
    await notes.mark(dsn, "after")
    assert notes.before("after") == 4, f"{notes.before('after')} NOTIFYs, {_gaps(notes.at)} apart"
    gaps = _gaps(notes.at)
    assert gaps[0] > 0.4 and gaps[1] > 0.9 and gaps[2] > 1.9, f"NOTIFYs {gaps} apart"


async def test_a_worker_taking_a_busy_queues_jobs_keeps_claiming_without_a_notify(
    dsn: str, client: JobsClient
) -> None:
    """Jobs keep coming, but their producer sends no NOTIFY (a busy queue's are up to 100 ms apart): a worker
    whose claim found several jobs on one NOTIFY, and whose claims since found jobs, claims again after its
    busy poll, not after `poll_interval` (60 s here, so every job below would miss its deadline without
    it). One job per NOTIFY starts no busy poll: test_claim.py's empty-claim test."""
    reg = ActorRegistry()

    @actor(name="tests.notify.busy", registry=reg)
    async def busy(payload: int) -> int:
        return payload

    async with running_worker(dsn, reg, poll_interval=60.0, concurrency=4) as worker:
        await wait_for(worker.parts.listener.connected.is_set)
        worker.parts.dispatcher.busy_poll = 0.5  # the next job goes in well within it, however loaded the machine
        # a quiet queue: the insert notifies, and the worker's claim finds both jobs
        for first in await client.enqueue_many(busy, [-1, 0]):
            assert (await first.wait(timeout=10)).status == "succeeded"
        notifier = client.backend.notifier
        notifier.quiet = lambda queue: False  # type: ignore[method-assign]
        notifier.send_now = lambda queue: False  # type: ignore[method-assign]
        notifier.after_commit = lambda queue: None  # type: ignore[method-assign]
        for i in range(1, 6):
            handle = await client.enqueue(busy, i)
            assert (await handle.wait(timeout=10)).status == "succeeded", f"job {i} was not claimed"
