"""Durable jobs in one worker process: steps run once per job, durable sleep and signals suspend the job
without a slot, ctx.transaction commits the actor's rows with the job's success (issue 32)."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from testkit import running_worker, wait_for

from taskq import (
    JobContext,
    JobFailed,
    JobNotFound,
    JobsClient,
    SignalInvalid,
    SignalRefused,
    SignalTimeout,
    StepInvalid,
    TransactionInvalid,
)
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants
from taskq.models import JobRow

pytestmark = pytest.mark.timeout(90)

EFFECTS = "CREATE TABLE IF NOT EXISTS public.durable_effects (job_id uuid, step text, attempt int)"


def effect(dsn: str, job_id: Any, step: str, attempt: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO public.durable_effects VALUES (%s, %s, %s)", (job_id, step, attempt))


KEPT: list[JobContext[Any]] = []
"""Contexts an actor kept past its return (d.keeps_ctx)."""


def durable_registry(dsn: str) -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="d.steps", registry=reg, max_attempts=3)
    async def steps(payload: int, ctx: JobContext[int]) -> list[Any]:
        async def second() -> dict[str, int]:
            effect(dsn, ctx.job_id, "b", ctx.attempt)
            return {"n": 2}

        def first(x: int) -> int:
            effect(dsn, ctx.job_id, "a", ctx.attempt)
            return x + 1

        a = await ctx.step("a", first, payload)
        b = await ctx.step("b", second)
        if ctx.attempt == 1:
            raise RuntimeError("fail after two steps")
        return [a, b, ctx.attempt]

    @actor(name="d.thread", registry=reg, max_attempts=3, isolation="thread")
    def thread_steps(payload: int, ctx: JobContext[int]) -> list[Any]:
        def first() -> int:
            effect(dsn, ctx.job_id, "a", ctx.attempt)
            return payload * 10

        a = ctx.step("a", first)
        if ctx.attempt == 1:
            raise RuntimeError("fail after a step")
        return [a, ctx.attempt]

    @actor(name="d.sleeper", registry=reg, max_attempts=1)
    async def sleeper(payload: float, ctx: JobContext[float]) -> int:
        def mark() -> int:
            effect(dsn, ctx.job_id, "before", ctx.attempt)
            return 1

        await ctx.step("before", mark)
        await ctx.sleep(timedelta(seconds=payload))
        effect(dsn, ctx.job_id, "after", ctx.attempt)
        return ctx.attempt

    @actor(name="d.waiter", registry=reg, max_attempts=1)
    async def waiter(payload: float | None, ctx: JobContext[float | None]) -> Any:
        got = await ctx.wait_for_signal("go", timeout=payload)
        second = await ctx.wait_for_signal("go", timeout=payload)
        return [got, second]

    @actor(name="d.timeout", registry=reg, max_attempts=1)
    async def timing_out(payload: float, ctx: JobContext[float]) -> str:
        try:
            await ctx.wait_for_signal("never", timeout=payload)
        except SignalTimeout:
            return "timed out"
        return "signalled"

    @actor(name="d.quick", registry=reg, max_attempts=1)
    async def quick(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="d.twice", registry=reg, max_attempts=3)
    async def twice(payload: int, ctx: JobContext[int]) -> int:
        await ctx.step("same", lambda: 1)
        await ctx.step("same", lambda: 2)
        return 0

    @actor(name="d.unjson", registry=reg, max_attempts=3)
    async def unjson(payload: int, ctx: JobContext[int]) -> int:
        await ctx.step("obj", lambda: object())
        return 0

    @actor(name="d.keeps_ctx", registry=reg, max_attempts=1)
    async def keeps_ctx(payload: int, ctx: JobContext[int]) -> int:
        KEPT.append(ctx)
        return payload

    @actor(name="d.tx", registry=reg, max_attempts=3)
    async def in_tx(payload: int, ctx: JobContext[int]) -> int:
        async with ctx.transaction() as conn:
            await conn.execute("INSERT INTO public.durable_effects VALUES (%s, 'tx', %s)", (ctx.job_id, ctx.attempt))
        if payload == 1 and ctx.attempt == 1:
            raise RuntimeError("after the block: nothing of the attempt commits")
        return ctx.attempt

    return reg


@pytest.fixture
async def effects(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(EFFECTS)
        await conn.execute("TRUNCATE public.durable_effects")

        async def rows(job_id: Any) -> list[tuple[str, int]]:
            cur = await conn.execute(
                "SELECT step, attempt FROM public.durable_effects WHERE job_id = %s ORDER BY step, attempt", (job_id,))
            return list(await cur.fetchall())

        yield rows


async def test_completed_steps_return_their_stored_result_on_the_retry(dsn: str, client: JobsClient,
                                                                       effects: Any) -> None:
    async with running_worker(dsn, durable_registry(dsn)):
        h = await client.enqueue("d.steps", 41)
        row = await h.wait(timeout=30)
        assert row.result == [42, {"n": 2}, 2]
        assert await effects(h.job_id) == [("a", 1), ("b", 1)]  # each ran once, on attempt 1
        steps = await client.steps(h.job_id)
        assert [(s.kind, s.name, s.attempt, s.result) for s in steps] == [
            ("step", "a", 1, 42), ("step", "b", 1, {"n": 2})]
        events = await client.events(h.job_id)
        assert [e.detail["step"] for e in events if e.kind == "step"] == ["a", "b"]

        t = await client.enqueue("d.thread", 7)
        assert (await t.wait(timeout=30)).result == [70, 2]
        assert await effects(t.job_id) == [("a", 1)]

        # an operator's requeue keeps the completed steps; with reset_steps=True the rerun starts over
        kept = await client.enqueue("d.steps", 1, max_attempts=1)
        reset = await client.enqueue("d.steps", 1, max_attempts=1)
        for h in (kept, reset):
            with pytest.raises(JobFailed):
                await h.wait(timeout=30)
        assert (await client.requeue(kept.job_id)).requeued
        assert (await client.requeue(reset.job_id, reset_steps=True)).requeued
        assert (await kept.wait(timeout=30)).result == [2, {"n": 2}, 2]
        assert (await reset.wait(timeout=30)).result == [2, {"n": 2}, 2]
        assert await effects(kept.job_id) == [("a", 1), ("b", 1)]
        assert await effects(reset.job_id) == [("a", 1), ("a", 2), ("b", 1), ("b", 2)]
        requeued = [e for e in await client.events(reset.job_id) if e.kind == "requeued"]
        assert requeued[0].detail.get("reset_steps") is True
    await assert_invariants(dsn)


async def test_step_misuse_fails_the_job_at_once(dsn: str, client: JobsClient, effects: Any) -> None:
    async with running_worker(dsn, durable_registry(dsn)):
        twice = await client.enqueue("d.twice", 0)
        unjson = await client.enqueue("d.unjson", 0)
        for h, needle in ((twice, "used twice"), (unjson, "cannot be stored as JSON")):
            with pytest.raises(JobFailed):
                await h.wait(timeout=30)
            row = await row_of(client, h.job_id)
            assert (row.status.value, row.error_class, row.attempt) == ("failed", "StepInvalid", 1)
            assert needle in (row.error_message or "")
        assert [s.name for s in await client.steps(twice.job_id)] == ["same"]  # the first one was stored
        assert await client.steps(unjson.job_id) == []


async def test_a_sleep_frees_the_slot_and_resumes_after_its_steps(dsn: str, client: JobsClient,
                                                                 effects: Any) -> None:
    async with running_worker(dsn, durable_registry(dsn), concurrency=1):
        h = await client.enqueue("d.sleeper", 2.0)
        budget = (await row_of(client, h.job_id)).max_attempts

        async def sleeping() -> Any:
            row = await row_of(client, h.job_id)
            return row if row.status.value == "scheduled" and row.wait_kind == "sleep" else None

        row = await wait_for(sleeping, timeout=20)
        assert row.worker_id is None and row.lock_expires_at is None
        # the one slot is free: another job runs while it sleeps
        q = await client.enqueue("d.quick", 5)
        assert (await q.wait(timeout=10)).result == 5
        assert (await row_of(client, h.job_id)).status.value == "scheduled"
        done = await h.wait(timeout=30)
        assert done.result == 2 and done.max_attempts == budget + 1  # the sleep gave its attempt back
        assert await effects(h.job_id) == [("after", 2), ("before", 1)]
        kinds = [e.kind for e in await client.events(h.job_id)]
        assert "sleeping" in kinds
    await assert_invariants(dsn)


async def test_signals_wake_a_waiting_job_and_are_taken_once_in_order(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, durable_registry(dsn), concurrency=1):
        h = await client.enqueue("d.waiter", None)
        # a signal sent before the wait is kept for it
        first = await client.signal(h.job_id, "go", {"n": 1})
        assert first.status in ("pending", "running", "scheduled")

        async def waiting() -> Any:
            # the second wait, without timeout: the first one may have suspended before the signal came,
            # and a job the signal woke stays 'scheduled' (due now) until a worker takes it again
            row = await row_of(client, h.job_id)
            suspended = row.status.value == "scheduled" and row.wait_kind == "signal"
            return row if suspended and row.scheduled_at.year == 9999 else None

        row = await wait_for(waiting, timeout=20)
        assert row.wait_signal == "go"
        sent_at = time.monotonic()
        second = await client.signal(h.job_id, "go", {"n": 2})
        assert second.woke
        done = await h.wait(timeout=20)
        assert time.monotonic() - sent_at < 5
        assert done.result == [{"n": 1}, {"n": 2}]
        signals = await client.signals(h.job_id)
        assert [(s.payload, s.consumed_by) for s in signals] == [({"n": 1}, "go#1"), ({"n": 2}, "go#2")]
        # a signal to an ended job, or to no job, is refused
        with pytest.raises(SignalRefused):
            await client.signal(h.job_id, "go", 3)
        with pytest.raises(JobNotFound):
            await client.signal("0192f000-0000-7000-8000-000000000000", "go", 3)
        for bad in ("", "x" * 201, "a\nb"):
            with pytest.raises(SignalInvalid):
                await client.signal(h.job_id, bad, 1)
        with pytest.raises(SignalInvalid):
            await client.signal(h.job_id, "go", "x" * (1024 * 1024 + 1))
    await assert_invariants(dsn)


async def test_a_wait_that_times_out_raises_signal_timeout(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, durable_registry(dsn)):
        h = await client.enqueue("d.timeout", 0.5)
        assert (await h.wait(timeout=20)).result == "timed out"
        steps = await client.steps(h.job_id)
        assert [(s.kind, s.name, s.result) for s in steps] == [("signal", "never#1", {"timeout": True})]


async def test_transaction_commits_rows_with_the_success_or_nothing(dsn: str, client: JobsClient,
                                                                     effects: Any) -> None:
    async with running_worker(dsn, durable_registry(dsn)):
        ok = await client.enqueue("d.tx", 0)
        assert (await ok.wait(timeout=20)).result == 1
        assert await effects(ok.job_id) == [("tx", 1)]
        failed_first = await client.enqueue("d.tx", 1)
        assert (await failed_first.wait(timeout=20)).result == 2
        assert await effects(failed_first.job_id) == [("tx", 2)]  # attempt 1's row rolled back



async def assert_invariants(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


@pytest.mark.parametrize("listens", [True, False])
async def test_a_signal_wakes_the_waiting_job_by_notify_or_at_the_next_poll(dsn: str, client: JobsClient,
                                                                          listens: bool) -> None:
    # with LISTEN the wake-up must not wait for the poll (set long here); without it, one poll_interval
    poll = 5.0 if listens else 0.5
    overrides: dict[str, Any] = {"poll_interval": poll, "concurrency": 1}
    if not listens:
        overrides["transaction_pooler"] = True
    async with running_worker(dsn, durable_registry(dsn), **overrides):
        h = await client.enqueue("d.waiter", None)

        async def waiting(attempt: int) -> bool:
            row = await row_of(client, h.job_id)
            return row.status.value == "scheduled" and row.wait_kind == "signal" and row.attempt == attempt

        await wait_for(lambda: waiting(1), timeout=20)
        # the one slot is free while it waits
        q = await client.enqueue("d.quick", 3)
        assert (await q.wait(timeout=15)).result == 3
        await client.signal(h.job_id, "go", 1)
        await wait_for(lambda: waiting(2), timeout=20)  # it took the first and waits for the second
        sent = await client.signal(h.job_id, "go", 2)
        assert (await h.wait(timeout=20)).result == [1, 2]
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT extract(epoch FROM a.started_at - s.sent_at) FROM taskq.job_signals AS s "
                "JOIN taskq.job_attempts AS a ON a.job_id = s.job_id AND a.started_at > s.sent_at "
                "WHERE s.id = %s ORDER BY a.started_at LIMIT 1", (sent.signal_id,))
            (latency,) = await cur.fetchone()  # type: ignore[misc]
        if listens:
            assert latency < 1.0, f"woken after {latency:.3f} s: by the poll ({poll} s), not by the NOTIFY"
        else:
            assert latency < poll + 1.0, f"woken after {latency:.3f} s with a poll of {poll} s"


async def row_of(client: JobsClient, job_id: Any) -> JobRow:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row


async def test_a_suspended_job_cancels_at_once_and_retention_prunes_its_steps_and_signals(
        dsn: str, client: JobsClient, effects: Any) -> None:
    from taskq.backend import Backend
    from taskq.models import PruneClass
    from taskq.ops.retention import prune

    async with running_worker(dsn, durable_registry(dsn)):
        sleeping = await client.enqueue("d.sleeper", 3600.0)
        waiting = await client.enqueue("d.waiter", None)

        async def suspended(h: Any, kind: str) -> bool:
            row = await row_of(client, h.job_id)
            return row.status.value == "scheduled" and row.wait_kind == kind

        await wait_for(lambda: suspended(sleeping, "sleep"), timeout=20)
        await wait_for(lambda: suspended(waiting, "signal"), timeout=20)
        await client.signal(waiting.job_id, "other", {"kept": True})  # a signal no wait takes
        for h in (sleeping, waiting):
            result = await client.cancel(h.job_id, reason="no longer needed")
            assert (result.previous_status.value, result.new_status.value) == ("scheduled", "cancelled")
            row = await row_of(client, h.job_id)
            assert row.error_class == "CancelledBeforeStart" and row.worker_id is None
    assert len(await client.steps(sleeping.job_id)) == 2  # its step and its sleep
    assert len(await client.signals(waiting.job_id)) == 1
    backend = await Backend.open(dsn)
    try:
        await asyncio.sleep(0.01)  # past a window of 1 ms (cancelled jobs prune with the succeeded ones)
        pruned = await prune(backend, {PruneClass.SUCCEEDED: 0.001, PruneClass.FAILED: 0.001,
                                       PruneClass.ATTEMPTS: 0.001})
        assert pruned is not None
    finally:
        await backend.close()
    assert await client.get(sleeping.job_id) is None and await client.get(waiting.job_id) is None
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT (SELECT count(*) FROM taskq.job_steps WHERE job_id = ANY(%(ids)s)), "
            "(SELECT count(*) FROM taskq.job_signals WHERE job_id = ANY(%(ids)s))",
            {"ids": [sleeping.job_id, waiting.job_id]})
        assert await cur.fetchone() == (0, 0)
    await assert_invariants(dsn)


async def test_durable_calls_after_the_actor_returned_are_refused(dsn: str, client: JobsClient) -> None:
    KEPT.clear()
    async with running_worker(dsn, durable_registry(dsn)):
        h = await client.enqueue("d.keeps_ctx", 3)
        assert (await h.wait(timeout=20)).result == 3
    (ctx,) = KEPT
    with pytest.raises(TransactionInvalid, match="after the actor returned"):
        ctx.transaction()
    with pytest.raises(StepInvalid, match="has returned"):
        await ctx.step("late", lambda: 1)
    with pytest.raises(StepInvalid, match="has returned"):
        await ctx.sleep(1)
    assert await client.steps(h.job_id) == []
