"""Thread isolation against a real PostgreSQL: real actor threads, real async-exception injection."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from apps.taskq_isolation_app import spin_until
from prometheus_client import REGISTRY
from testkit import running_worker, wait_for

from taskq import JobContext, JobFailed, JobsClient, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.actors.thread import ActorInterrupted, ThreadExecutor, inject_exception
from taskq.models import JobStatus
from taskq.worker import exitcodes
from taskq.worker.main import Worker

pytestmark = pytest.mark.timeout(60)


def thread_executor(worker: Worker, reg: ActorRegistry, name: str) -> ThreadExecutor:
    executor = worker.executor_for(reg[name])
    assert isinstance(executor, ThreadExecutor)
    return executor


async def test_thread_actor_result_is_stored_while_the_heartbeat_keeps_ticking(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    ticks: dict[str, int] = {}
    holder: dict[str, Worker] = {}

    @actor(name="burn", registry=reg)
    def burn(payload: float, ctx: JobContext[float]) -> dict[str, Any]:
        heartbeat = holder["worker"].parts.heartbeat
        ticks["start"] = heartbeat.ticks
        # pure Python, holding the GIL but for switches, until the heartbeat has ticked 5 times (however
        # slowly a loaded machine runs the loop) or `payload` seconds have gone by
        found = spin_until(time.monotonic() + payload, stop=lambda: heartbeat.ticks - ticks["start"] >= 5)
        ticks["end"] = heartbeat.ticks
        return {"primes": found, "thread": threading.current_thread().name}

    async with running_worker(dsn, reg) as worker:
        holder["worker"] = worker
        handle = await client.enqueue(burn, 15.0)
        row = await handle.wait(timeout=30)
    assert row.status is JobStatus.SUCCEEDED and row.result["primes"] > 100
    assert row.result["thread"] == f"taskq-actor-{handle.job_id}"
    # heartbeat every 0.1 s: a loop blocked by the actor would not have ticked at all during 15 s
    assert ticks["end"] - ticks["start"] >= 5, ticks


async def test_thread_slots_are_bounded_by_max_threads(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()
    lock = threading.Lock()
    inside = [0]
    most = [0]

    @actor(name="one_at_a_time", registry=reg)
    def one_at_a_time(payload: int, ctx: JobContext[int]) -> int:
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        spin_until(time.monotonic() + 0.2)
        with lock:
            inside[0] -= 1
        return payload

    async with running_worker(dsn, reg, max_threads=1, concurrency=5):
        handles = [await client.enqueue(one_at_a_time, n) for n in range(3)]
        rows = [await h.wait(timeout=20) for h in handles]
    assert [r.result for r in rows] == [0, 1, 2] and most[0] == 1


async def test_thread_actor_sees_the_flag_and_progress_sync_is_persisted_from_its_thread(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()

    @actor(name="polite", registry=reg)
    def polite(payload: int, ctx: JobContext[int]) -> int:
        ctx.progress_sync({"step": 1}, message="started")
        spin_until(time.monotonic() + 60, lambda: ctx.cancellation_requested)
        raise asyncio.CancelledError  # give the attempt up: the job ends cancelled

    async with running_worker(dsn, reg, cancellation_grace_period=10.0, cleanup_grace_period=10.0):
        handle = await client.enqueue(polite, 1)
        await wait_for(lambda: _progress_message(client, handle.job_id, "started"))
        await client.cancel(handle.job_id)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    row = failed.value.row
    assert row.status is JobStatus.CANCELLED and row.error_class == "CancelledCooperatively"
    assert row.progress == {"data": {"step": 1}, "message": "started"}


async def test_thread_actor_ignoring_the_cancel_is_interrupted_at_phase_two_and_the_worker_keeps_serving(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    events: list[str] = []

    @actor(name="stubborn", registry=reg)
    def stubborn(payload: int, ctx: JobContext[int]) -> int:
        ctx.progress_sync(None, message="started")
        try:
            while True:  # a tight pure-Python loop that even swallows every Exception
                try:
                    spin_until(time.monotonic() + 0.05)
                except Exception:
                    events.append("swallowed")
        except ActorInterrupted:
            events.append("interrupted")
            raise
        finally:
            events.append("finally")

    @actor(name="quick", registry=reg)
    def quick(payload: int, ctx: JobContext[int]) -> int:
        return payload * 2

    async with running_worker(dsn, reg) as worker:
        handle = await client.enqueue(stubborn, 1)
        await wait_for(lambda: _progress_message(client, handle.job_id, "started"))
        await client.cancel(handle.job_id)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
        after = await (await client.enqueue(quick, 21)).wait(timeout=10)
        executor = thread_executor(worker, reg, "stubborn")
        await wait_for(lambda: executor.live_threads == 0, timeout=5)
        assert worker.leaked_threads() == 0
    row = failed.value.row
    assert row.status is JobStatus.CANCELLED and row.error_class == "CancelledForced"
    assert events == ["interrupted", "finally"]
    assert after.result == 42


async def test_thread_actor_past_its_timeout_is_interrupted_and_retried(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(
        name="slow_once", registry=reg, timeout=0.3, max_attempts=2, retry=RetryPolicy(base=0.05, jitter=0)
    )
    def slow_once(payload: int, ctx: JobContext[int]) -> int:
        if ctx.attempt == 1:
            spin_until(time.monotonic() + 60)  # ignores the flag: only the injected exception stops it
        return ctx.attempt

    async with running_worker(dsn, reg):
        handle = await client.enqueue(slow_once, 1)
        row = await handle.wait(timeout=20)
    assert row.result == 2
    first, _ = await client.attempts(handle.job_id)
    assert (first.outcome, first.error_class) == ("retried", "AttemptTimeout")


async def test_thread_blocked_outside_bytecode_is_abandoned_leaked_and_the_worker_restarts_itself(
    dsn: str, client: JobsClient
) -> None:
    """A thread blocked in C cannot be interrupted. The test blocks it on a threading.Event (a lock
    acquire, as deaf to injection as time.sleep) so that it can let the thread go when it is done:
    the process-level test in tests/system uses time.sleep(10**6) and lets the process exit end it."""
    reg = ActorRegistry()
    release = threading.Event()

    @actor(name="blocked", registry=reg)
    def blocked(payload: int, ctx: JobContext[int]) -> int:
        ctx.progress_sync(None, message="started")
        release.wait()
        return 0

    @actor(name="bystander", registry=reg)
    async def bystander(payload: int, ctx: JobContext[int]) -> int:
        await ctx.progress(None, message="started")
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    try:
        async with running_worker(dsn, reg, max_leaked_threads=0) as worker:
            other = await client.enqueue(bystander, 1)
            handle = await client.enqueue(blocked, 1)
            await wait_for(lambda: _progress_message(client, handle.job_id, "started"))
            await wait_for(lambda: _progress_message(client, other.job_id, "started"))
            await client.cancel(handle.job_id)
            with pytest.raises(JobFailed) as failed:
                await handle.wait(timeout=10)
            assert worker.leaked_threads() == 1
            assert REGISTRY.get_sample_value("taskq_leaked_threads") == 1
            # the worker stops by itself (nobody asked it to) with the documented exit code
            await wait_for(lambda: worker.draining, timeout=10)
            assert worker.state.exit_code == exitcodes.LEAKED_THREADS
            await wait_for(lambda: worker.state.summary["released"], timeout=10)
        row = failed.value.row
        assert row.status is JobStatus.ABANDONED and row.error_class == "CancelAbandoned"
        released = await other.refresh()
        assert released.status is JobStatus.PENDING and released.interrupt_count == 1
        assert worker.state.summary["released"] == [str(other.job_id)]
    finally:
        release.set()
        executor = thread_executor(worker, reg, "blocked")
        await wait_for(lambda: executor.live_threads == 0, timeout=5)
    assert executor.leaked_threads == 0  # once it left, the thread is no longer counted


async def _progress_message(client: JobsClient, job_id: Any, message: str) -> bool:
    row = await client.backend.get(job_id)
    return row is not None and isinstance(row.progress, dict) and row.progress.get("message") == message


async def test_thread_stuck_past_its_timeout_is_counted_as_leaked_and_keeps_its_job_until_it_leaves(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    release = threading.Event()

    @actor(name="stuck", registry=reg, timeout=0.2, max_attempts=1)
    def stuck(payload: int, ctx: JobContext[int]) -> int:
        release.wait()
        return 0

    try:
        async with running_worker(dsn, reg, max_leaked_threads=1) as worker:
            handle = await client.enqueue(stuck, 1)
            # forced at 0.2 s, given up 0.3 s (the cleanup grace) later: counted, one leak allowed here
            await wait_for(lambda: worker.leaked_threads() == 1, timeout=10)
            assert REGISTRY.get_sample_value("taskq_leaked_threads") == 1 and not worker.draining
            # no verdict while the actor still executes: a retry could run beside it
            assert (await handle.refresh()).status is JobStatus.RUNNING
            release.set()
            with pytest.raises(JobFailed) as failed:
                await handle.wait(timeout=10)
            assert worker.leaked_threads() == 0
            assert REGISTRY.get_sample_value("taskq_leaked_threads") == 0
        assert failed.value.row.error_class == "AttemptTimeout"
    finally:
        release.set()


async def test_shutdown_interrupts_a_thread_actor_and_releases_its_job(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()
    events: list[str] = []

    @actor(name="deaf", registry=reg)
    def deaf(payload: int, ctx: JobContext[int]) -> int:
        ctx.progress_sync({"cursor": 7}, message="started")
        try:
            spin_until(time.monotonic() + 60)
        finally:
            events.append("finally")
        return 0

    async with running_worker(dsn, reg) as worker:
        handle = await client.enqueue(deaf, 1)
        await wait_for(lambda: _progress_message(client, handle.job_id, "started"))
    row = await handle.refresh()
    assert row.status is JobStatus.PENDING and row.interrupt_count == 1 and row.cancel_requested_at is None
    assert row.progress == {"data": {"cursor": 7}, "message": "started"}
    assert events == ["finally"] and worker.state.summary["released"] == [str(handle.job_id)]


def test_injecting_into_a_thread_that_does_not_exist_reports_it() -> None:
    ghost = max(t.ident or 0 for t in threading.enumerate()) + 4096
    assert inject_exception(ghost, ActorInterrupted) is False
