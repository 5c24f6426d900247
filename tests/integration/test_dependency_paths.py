"""Every path that writes a terminal status passes the one dependency hook (the jobs_settle_dependents
trigger): for each, a parent with a waiting child ends by that path, and the child settles in the same
transaction. Real PostgreSQL and real in-process workers; the paths that need real processes and signals
(kill -9 then sweeper or supervisor reclaim, shutdown's cancelled verdict) are in
tests/system/test_dependency_processes.py."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFilter, JobsClient, JobStatus, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(120)


async def assert_invariants_hold(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


def settled_in_same_transaction(dsn: str, parent: Any, child: Any) -> bool:
    """The child's settling event was written by the transaction that wrote the parent's terminal event."""
    rows = query(dsn, "SELECT job_id, xmin::text FROM taskq.job_events WHERE job_id = ANY(%s) "
                      "AND to_status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned', 'pending') "
                      "AND from_status IS DISTINCT FROM to_status", [parent, child])
    xids = {job: xid for job, xid in rows}
    return xids.get(parent) is not None and xids.get(parent) == xids.get(child)


SWALLOWER_DONE = asyncio.Event()


def paths_registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="p.ok", queues=["default", "nobody"], registry=reg)  # "nobody": no worker serves it
    async def ok(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="p.exhaust", registry=reg, max_attempts=2, retry=RetryPolicy(base=0.05, jitter=0))
    async def exhaust(payload: int, ctx: JobContext[int]) -> None:
        raise RuntimeError(f"attempt {ctx.attempt}")

    @actor(name="p.timeout", registry=reg, timeout=0.2, max_attempts=1)
    async def timeout(payload: int, ctx: JobContext[int]) -> None:
        await asyncio.sleep(60)

    @actor(name="p.coop", registry=reg)
    async def coop(payload: int, ctx: JobContext[int]) -> None:
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    @actor(name="p.stubborn", registry=reg)
    async def stubborn(payload: int, ctx: JobContext[int]) -> None:
        await asyncio.sleep(60)  # never looks at the cancel request: forced

    @actor(name="p.swallower", registry=reg)
    async def swallower(payload: int, ctx: JobContext[int]) -> None:
        loop = asyncio.get_running_loop()
        end = loop.time() + 3.0
        try:
            while loop.time() < end:
                with contextlib.suppress(asyncio.CancelledError):  # survives the force: abandoned
                    await asyncio.sleep(0.05)
        finally:
            SWALLOWER_DONE.set()

    return reg


async def started(dsn: str, job_id: Any) -> bool:
    return bool(query(dsn, "SELECT 1 FROM taskq.jobs WHERE id = %s AND status = 'running'", job_id))


CASES: dict[str, tuple[str, dict[str, Any], str | None, tuple[str, str | None]]] = {
    # path: (actor, enqueue options, how the parent ends, the child's cause)
    "finish": ("p.ok", {}, None, ("succeeded", None)),
    "retries_exhausted": ("p.exhaust", {}, None, ("failed", "parent-failure:failed")),
    "attempt_timeout": ("p.timeout", {}, None, ("failed", "parent-failure:failed")),
    "schedule_to_close_while_running": ("p.stubborn", {"schedule_to_close": 0.5}, None,
                                        ("failed", "parent-failure:failed")),
    "deadline_sweep_before_start": ("p.ok", {"schedule_to_close": 0.3, "queue": "nobody"}, None,
                                    ("failed", "parent-failure:failed")),
    "operator_cancel_pending": ("p.ok", {"queue": "nobody"}, "cancel", ("cancelled", "parent-failure:cancelled")),
    "operator_cancel_where": ("p.ok", {"queue": "nobody"}, "cancel_where", ("cancelled", "parent-failure:cancelled")),
    "cooperative_cancel": ("p.coop", {}, "cancel_running", ("cancelled", "parent-failure:cancelled")),
    "forced_cancel": ("p.stubborn", {}, "cancel_running", ("cancelled", "parent-failure:cancelled")),
    "abandon": ("p.swallower", {}, "cancel_running", ("abandoned", "parent-failure:abandoned")),
    "sweeper_reclaim": ("p.ok", {"queue": "nobody", "max_attempts": 1}, "lose_worker",
                        ("crashed", "parent-failure:crashed")),
}


@pytest.mark.parametrize("path", list(CASES))
async def test_every_terminal_path_settles_the_children_in_the_parents_transaction(dsn: str, path: str) -> None:
    actor_name, options, action, (parent_status, cause) = CASES[path]
    reg = paths_registry()
    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg):
        async with client.workflow() as wf:  # one transaction: the child waits before the parent can run
            parent = wf.enqueue(actor_name, 1, **options)
            child = wf.enqueue("p.ok", 2, depends_on=[parent], queue="nobody")
        if action == "cancel":
            await client.cancel(parent.job_id)
        elif action == "cancel_where":
            await client.cancel_where(JobFilter(ids=(parent.job_id,)))
        elif action == "cancel_running":
            await wait_for(lambda: started(dsn, parent.job_id), timeout=20)
            await client.cancel(parent.job_id)
        elif action == "lose_worker":
            # the parent held by a worker that is gone: its claim lock and its worker's lease have passed
            query(dsn, "INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at) "
                       "VALUES ('ghost', 'nowhere', 1, '{nobody}', 1, now() - interval '1 minute')")
            query(dsn, "WITH c AS (UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, "
                       "worker_id = 'ghost', started_at = now(), lock_expires_at = now() - interval '1 minute' "
                       "WHERE id = %s RETURNING id) "
                       "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
                       "SELECT id, 1, 1, 'ghost' FROM c", parent.job_id)
            query(dsn, "INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, "
                       "detail) VALUES (%s, 'state_change', 'pending', 'running', 1, 'ghost', "
                       "'{\"claim_epoch\": 1}')", parent.job_id)
        ended = await wait_for(lambda: _terminal(client, parent.job_id), timeout=40)
        assert ended.status == parent_status, ended
        row = await child.handle.refresh()
        if cause is None:
            assert row.status is JobStatus.PENDING
        else:
            assert (row.status, row.error_class, row.cancel_reason) == ("cancelled", "ParentFailed", cause)
        assert settled_in_same_transaction(dsn, parent.job_id, child.job_id)
        if path == "abandon":  # let the abandoned actor run out before the worker stops
            await asyncio.wait_for(SWALLOWER_DONE.wait(), 20)
    await assert_invariants_hold(dsn)


async def _terminal(client: JobsClient, job_id: Any) -> Any:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row if handle.row.is_terminal else None
