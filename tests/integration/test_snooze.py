"""Snooze: an actor raises taskq.Snooze(delay); the job goes back to scheduled without using its budget,
while attempt and claim_epoch still rise; a `snoozed` event and attempts row each time."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from apps import taskq_isolation_app as app
from testkit import running_worker, wait_for

from taskq import JobContext, JobsClient, Snooze, SnoozeInvalid
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants
from taskq.metrics import JOBS_SNOOZED

pytestmark = pytest.mark.timeout(90)


def snoozing_registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="snz.async", registry=reg, max_attempts=1)
    async def snooze_async(payload: int, ctx: JobContext[int]) -> list[int]:
        if ctx.attempt <= payload:
            raise Snooze(timedelta(milliseconds=50))
        return [ctx.attempt, ctx.claim_epoch]

    @actor(name="snz.thread", registry=reg, max_attempts=1, isolation="thread")
    def snooze_thread(payload: int, ctx: JobContext[int]) -> list[int]:
        assert threading.current_thread() is not threading.main_thread()
        if ctx.attempt <= payload:
            raise Snooze(0.05)
        return [ctx.attempt, ctx.claim_epoch]

    @actor(name="snz.long", registry=reg, max_attempts=1)
    async def snooze_long(payload: int, ctx: JobContext[int]) -> int:
        raise Snooze(3600)

    @actor(name="snz.bad", registry=reg, max_attempts=3)
    async def snooze_bad(payload: str, ctx: JobContext[str]) -> int:
        raise Snooze(float(payload))

    @actor(name="snz.stops", registry=reg, max_attempts=1)
    async def snooze_after_cancel(payload: int, ctx: JobContext[int]) -> int:
        await ctx.progress(1, message="started")
        await ctx.cancel_event.wait()
        raise Snooze(1)

    for a in app.actors:
        reg.register(a)
    return reg


async def check_three_snoozes_then_success(dsn: str, client: JobsClient, name: str) -> None:
    handle = await client.enqueue(name, 3, max_attempts=1)
    row = await handle.wait(timeout=30)
    result = row.result
    assert result[:2] == [4, 4], result  # attempt and claim_epoch rose through every snooze
    assert (row.status.value, row.attempt, row.claim_epoch, row.snooze_count, row.max_attempts) == (
        "succeeded", 4, 4, 3, 4)
    attempts = await client.attempts(handle.job_id)
    assert [(a.attempt, a.claim_epoch, a.outcome) for a in attempts] == [
        (1, 1, "snoozed"), (2, 2, "snoozed"), (3, 3, "snoozed"), (4, 4, "succeeded")]
    events = await client.events(handle.job_id)
    snoozed = [e for e in events if e.kind == "snoozed"]
    assert [(e.from_status, e.to_status, e.attempt, e.detail["delay"]) for e in snoozed] == [
        ("running", "scheduled", n, 0.05) for n in (1, 2, 3)]
    assert [e.to_status for e in events] == ["running", "scheduled"] * 3 + ["running", "succeeded"]


@pytest.mark.parametrize("name", ["snz.async", "snz.thread"])
async def test_three_snoozes_with_max_attempts_one_then_success(dsn: str, client: JobsClient, name: str) -> None:
    before = JOBS_SNOOZED._value.get()
    async with running_worker(dsn, snoozing_registry()):
        await check_three_snoozes_then_success(dsn, client, name)
    assert JOBS_SNOOZED._value.get() - before == 3
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.ok, report.render()


@pytest.mark.slow
async def test_a_process_actor_snoozes_across_the_child_boundary(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, snoozing_registry()):
        await check_three_snoozes_then_success(dsn, client, "iso.proc.snoozes")


async def test_a_snoozed_job_waits_scheduled_for_its_delay(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, snoozing_registry()) as worker:
        started = time.time()
        handle = await client.enqueue("snz.long", 1)

        async def snoozed() -> Any:
            row = (await handle.refresh())
            return row if row.status == "scheduled" and row.snooze_count == 1 else None

        row = await wait_for(snoozed)
        assert row.error_class is None and row.finished_at is None and row.worker_id is None
        assert 3590 < row.scheduled_at.timestamp() - started < 3610 + (time.time() - started)
        assert handle.job_id not in worker.registry


@pytest.mark.parametrize("delay", ["-1", "nan", "inf", "1e12"])
async def test_a_bad_snooze_delay_fails_the_job_at_once(dsn: str, client: JobsClient, delay: str) -> None:
    async with running_worker(dsn, snoozing_registry()):
        handle = await client.enqueue("snz.bad", delay)
        row = await wait_for(lambda: _terminal(handle))
    assert (row.status.value, row.error_class, row.attempt, row.snooze_count) == ("failed", "SnoozeInvalid", 1, 0)
    assert "Snooze delay must be" in (row.error_message or "")


async def _terminal(handle: Any) -> Any:
    row = await handle.refresh()
    return row if row.is_terminal else None


def test_snooze_validates_its_delay() -> None:
    assert Snooze(timedelta(minutes=2)).delay == 120.0 and Snooze(0).delay == 0.0
    for bad in (-0.5, float("nan"), float("inf"), "10", True, None, timedelta(days=-1)):
        with pytest.raises(SnoozeInvalid):
            Snooze(bad)  # type: ignore[arg-type]


async def test_an_operator_cancel_wins_over_a_snooze(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, snoozing_registry()):
        handle = await client.enqueue("snz.stops", 1)
        await wait_for(lambda: _started(handle))
        await client.cancel(handle.job_id, reason="stop")
        row = await wait_for(lambda: _terminal(handle))
    assert (row.status.value, row.snooze_count, row.max_attempts) == ("cancelled", 0, 3)
    assert not [e for e in await client.events(handle.job_id) if e.kind == "snoozed"]


async def _started(handle: Any) -> bool:
    row = await handle.refresh()
    return bool(row.progress and row.progress.get("message") == "started")


async def test_a_snooze_written_over_a_newer_cancel_request_ends_cancelled(dsn: str, client: JobsClient) -> None:
    """The cancel request commits after the actor decided to snooze but before the write: the database
    turns the snooze into a cancel, as it does a retry."""
    gate = asyncio.Event()
    reg = ActorRegistry()

    @actor(name="snz.gated", registry=reg, max_attempts=1)
    async def gated(payload: int, ctx: JobContext[int]) -> int:
        await ctx.progress(1, message="started")
        await gate.wait()
        raise Snooze(1)

    async with running_worker(dsn, reg, heartbeat_interval=20.0, lock_timeout=60.0) as worker:
        handle = await client.enqueue(gated, 1)
        await wait_for(lambda: _started(handle))
        # write the request without letting the worker hear of it first (no NOTIFY reaches the actor)
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("UPDATE taskq.jobs SET cancel_requested_at = now(), cancel_phase = 1 WHERE id = %s",
                               (handle.job_id,))
        entry = worker.registry.get(handle.job_id)
        assert entry is not None and entry.cancel_origin is None
        gate.set()
        row = await wait_for(lambda: _terminal(handle))
    assert (row.status.value, row.error_class, row.snooze_count) == ("cancelled", "CancelledCooperatively", 0)


def run_cli(dsn: str, *args: str) -> str:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"TASKQ_DSN": dsn}
    result = subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 0 and result.stderr == "", result
    return result.stdout


async def test_taskq_job_and_jobs_show_the_snoozes(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, snoozing_registry()):
        handle = await client.enqueue("snz.long", 1, max_attempts=1)
        await wait_for(lambda: _scheduled_after_snooze(handle))
    detail = await asyncio.to_thread(run_cli, dsn, "job", str(handle.job_id))
    assert "1 of 2 (claim epoch 1, interrupted 0 times, snoozed 1 times)" in detail
    snoozed = [line for line in detail.splitlines() if "running -> scheduled" in line]
    assert len(snoozed) == 1 and " snoozed " in snoozed[0] and '"delay": 3600' in snoozed[0], detail
    listing = await asyncio.to_thread(run_cli, dsn, "jobs")
    assert "1/2 (1 snoozed)" in listing


async def _scheduled_after_snooze(handle: Any) -> bool:
    row = await handle.refresh()
    return bool(row.status == "scheduled" and row.snooze_count == 1)
