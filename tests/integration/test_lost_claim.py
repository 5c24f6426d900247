"""A claim lost with a failover (issue 33): the new primary never saw the claim's commit, so it issues the
same attempt and claim epoch again. The old run's late writes must not pass the new claim's fence when
another worker holds it, and the worker that already runs the job must not run it a second time when the
new claim is its own.

A real failover is in tests/ha/; here the lost commit is reproduced on one server: the row is put back to
what the new primary would hold, with the triggers off (session_replication_role = replica), as a row
that arrived by replication does not fire them either."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(60)

RUNS: list[tuple[Any, int, int]] = []
GATE: dict[Any, asyncio.Event] = {}


def registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="lc.hold", registry=reg, max_attempts=3)
    async def hold(payload: str, ctx: JobContext[str]) -> str:
        RUNS.append((ctx.job_id, ctx.attempt, ctx.claim_epoch))
        await GATE.setdefault(ctx.job_id, asyncio.Event()).wait()
        await ctx.progress({"done": payload})
        return payload

    return reg


async def assert_invariants_hold(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


def stale_writes() -> float:
    return REGISTRY.get_sample_value("taskq_stale_writes_total") or 0.0


def replicated(dsn: str, *statements: tuple[str, tuple[Any, ...]]) -> None:
    """Run `statements` in one transaction as replication applies rows: no trigger fires."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for text, params in statements:
            conn.execute(text, params)


async def started(job_id: Any, count: int = 1) -> bool:
    return sum(1 for r in RUNS if r[0] == job_id) >= count


async def test_a_claim_reissued_to_another_worker_refuses_the_old_runs_writes(dsn: str, client: JobsClient) -> None:
    RUNS.clear()
    async with running_worker(dsn, registry(), concurrency=2):
        h = await client.enqueue("lc.hold", "late")
        await wait_for(lambda: started(h.job_id), timeout=15)
        # the claim's commit is lost with the old primary; on the new one another worker claims the job and
        # gets the same attempt and epoch
        replicated(dsn,
                   ("INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at) "
                    "VALUES ('ha-other', 'elsewhere', 1, '{default}', 1, now() + interval '1 hour')", ()),
                   ("UPDATE taskq.jobs SET revision = revision + 1, worker_id = 'ha-other', started_at = now(), "
                    "lock_expires_at = now() + interval '1 hour' WHERE id = %s", (h.job_id,)),
                   ("UPDATE taskq.job_attempts SET worker_id = 'ha-other' WHERE job_id = %s", (h.job_id,)))
        before = stale_writes()
        GATE[h.job_id].set()  # the old run ends: its progress and its success are late writes
        await wait_for(lambda: stale_writes() > before, timeout=15)
        row = (await client.get(h.job_id)).row  # type: ignore[union-attr]
        assert row is not None
        assert (row.status.value, row.worker_id, row.attempt, row.result, row.progress) == (
            "running", "ha-other", 1, None, None), "the old run's write passed the reissued claim's fence"
        # the other worker is gone for good: its claim is reclaimed as any dead worker's
        query(dsn, "UPDATE taskq.workers SET lease_expires_at = now() - interval '1 minute' WHERE id = 'ha-other'")
        query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, lock_expires_at = now() - interval '1 minute' "
                   "WHERE id = %s", h.job_id)
        done = await h.wait(timeout=30)
        assert done.result == "late" and done.attempt == 2
    assert [r for r in RUNS if r[0] == h.job_id] == [(h.job_id, 1, 1), (h.job_id, 2, 2)]
    query(dsn, "DELETE FROM taskq.workers WHERE id = 'ha-other'")
    await assert_invariants_hold(dsn)


async def test_a_claim_reissued_to_the_same_worker_keeps_the_run_in_progress(dsn: str, client: JobsClient,
                                                                             caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    RUNS.clear()
    caplog.set_level(logging.WARNING, logger="taskq.worker")
    async with running_worker(dsn, registry(), concurrency=2) as worker:
        h = await client.enqueue("lc.hold", "once")
        await wait_for(lambda: started(h.job_id), timeout=15)
        # the claim is lost with the old primary: the new one holds the job pending, as enqueued
        replicated(dsn,
                   ("UPDATE taskq.jobs SET revision = revision + 1, status = 'pending', attempt = 0, claim_epoch = 0,"
                    " worker_id = NULL, started_at = NULL, lock_expires_at = NULL WHERE id = %s", (h.job_id,)),
                   ("DELETE FROM taskq.job_attempts WHERE job_id = %s", (h.job_id,)),
                   ("DELETE FROM taskq.job_events WHERE job_id = %s AND to_status = 'running'", (h.job_id,)))
        query(dsn, "NOTIFY taskq_jobs, 'default'")  # as the enqueue's on the new primary; the poll finds it too

        async def reclaimed() -> bool:
            rows = query(dsn, "SELECT status, attempt, worker_id FROM taskq.jobs WHERE id = %s", h.job_id)
            return rows == [("running", 1, worker.worker_id)]

        await wait_for(reclaimed, timeout=15)
        await wait_for(lambda: "was claimed again while it runs here" in caplog.text, timeout=5)
        GATE[h.job_id].set()
        done = await h.wait(timeout=15)
        assert (done.result, done.attempt, done.progress) == ("once", 1, {"data": {"done": "once"}, "message": None})
    assert [r for r in RUNS if r[0] == h.job_id] == [(h.job_id, 1, 1)], "the job ran twice for one claim"
    await assert_invariants_hold(dsn)
