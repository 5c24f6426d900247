"""The invariant checker finds nothing on a healthy history and names each kind of corruption."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from testkit import running_worker, wait_for

from taskq import JobContext, JobFailed, JobsClient, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(60)


async def running(handle: Any) -> bool:
    return bool((await handle.refresh()).status == "running")


async def report_for(dsn: str):  # type: ignore[no-untyped-def]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await check_invariants(conn, stale_after=0)


async def test_a_healthy_history_has_no_violations(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="ok", registry=reg)
    async def ok(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="bad", registry=reg, max_attempts=2, retry=RetryPolicy(base=0.05, jitter=0))
    async def bad(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("no")

    @actor(name="waits", registry=reg)
    async def waits(payload: int, ctx: JobContext[int]) -> int:
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    async with running_worker(dsn, reg):
        handles = [await client.enqueue(ok, i) for i in range(5)]
        failing = await client.enqueue(bad, 1)
        waiting = await client.enqueue(waits, 1)
        queued = await client.enqueue(ok, 9, scheduled_at=timedelta(hours=1))
        for h in handles:
            await h.wait(timeout=10)
        with pytest.raises(JobFailed):
            await failing.wait(timeout=10)
        await client.cancel(queued.job_id)
        await client.cancel(waiting.job_id)
        with pytest.raises(JobFailed):
            await waiting.wait(timeout=10)
        stopping = await client.enqueue(waits, 2)
        await wait_for(lambda: running(stopping))
    report = await report_for(dsn)
    assert report.violations == [], report.render()
    assert report.jobs_by_status == {"succeeded": 5, "failed": 1, "cancelled": 2, "pending": 1}


@pytest.mark.parametrize(
    ("corruption", "invariant"),
    [
        (
            "UPDATE taskq.jobs SET status='succeeded', finished_at=now(), attempt=1, claim_epoch=1",
            "inv_terminal_events",
        ),
        (
            "UPDATE taskq.jobs SET attempt = 0, claim_epoch = 0, status='running', worker_id='w', "
            "lock_expires_at = now() - interval '1 h'",
            "inv_stuck_running",
        ),
        ("UPDATE taskq.jobs SET interrupt_count = 2", "inv_interrupts_match_releases"),
        ("UPDATE taskq.jobs SET requeue_count = 1", "inv_requeues_have_events"),
        (
            "INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail) "
            "SELECT id, 'requeued', 'failed', 'pending', 3, '{\"claim_epoch\": 3}' FROM taskq.jobs",
            "inv_requeue_monotonic",
        ),
        (
            "DROP INDEX taskq.jobs_unique_key_idx; "
            "INSERT INTO taskq.jobs (actor, unique_key, unique_scope) "
            "VALUES ('x', 'k', 'active'), ('x', 'k', 'active')",
            "inv_unique_key_single_holder",
        ),
        (
            "INSERT INTO taskq.jobs (id, actor, status, parents_remaining, dependency_mode) "
            "VALUES ('00000000-0000-0000-0000-000000000001', 'c', 'awaiting_parents', 1, 'on_success'); "
            "INSERT INTO taskq.job_dependencies (parent_id, child_id, resolved_at, parent_status) "
            "SELECT id, '00000000-0000-0000-0000-000000000001', now(), 'succeeded' FROM taskq.jobs WHERE actor = 'x'; "
            "UPDATE taskq.jobs SET status = 'succeeded', finished_at = now() WHERE actor = 'x'",
            "inv_awaiting_parents_settled",
        ),
        (
            "INSERT INTO taskq.jobs (actor, status, error_class, cancel_reason, cancel_requested_at, finished_at) "
            "VALUES ('c', 'cancelled', 'ParentFailed', 'parent-failure:failed', now(), now())",
            "inv_parent_failed_has_failed_parent",
        ),
        (
            "INSERT INTO taskq.jobs (id, actor, status, parents_remaining, dependency_mode) "
            "VALUES ('00000000-0000-0000-0000-000000000001', 'c', 'awaiting_parents', 2, 'on_success'); "
            "INSERT INTO taskq.job_dependencies (parent_id, child_id) "
            "SELECT id, '00000000-0000-0000-0000-000000000001' FROM taskq.jobs WHERE actor = 'x'",
            "inv_parents_remaining_matches_edges",
        ),
        # durable jobs (issue 32): a step no claim of the job stored; a signal taken by no wait (or held by a
        # wait that did not take it); a suspended job still held
        (
            "INSERT INTO taskq.job_steps (job_id, kind, name, attempt, claim_epoch, result) "
            "SELECT id, 'step', 's', 1, 1, '1' FROM taskq.jobs",
            "inv_step_by_holder",
        ),
        (
            "INSERT INTO taskq.job_signals (job_id, name, consumed_at, consumed_attempt, consumed_epoch, consumed_by) "
            "SELECT id, 'go', now(), 1, 1, 'go#1' FROM taskq.jobs",
            "inv_signal_taken_once",
        ),
        (
            "UPDATE taskq.jobs SET status = 'scheduled', wait_kind = 'sleep', worker_id = 'w', "
            "lock_expires_at = now() + interval '1 h'",
            "inv_suspended_holds_nothing",
        ),
    ],
)
async def test_each_kind_of_corruption_is_reported(
    dsn: str, client: JobsClient, corruption: str, invariant: str
) -> None:
    await client.enqueue("x", 1)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(corruption)
    report = await report_for(dsn)
    assert invariant in {v.invariant for v in report.violations}, report.render()
    assert "violations: 0" not in report.render()
