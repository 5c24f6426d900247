"""The chaos run, bounded for CI; proof that its checks can fail; regressions for what it found.

The run itself (see chaos.py and docs/chaos.md) starts its own PostgreSQL server, 3 supervised worker
processes and a fault driver. The other tests run an in-process worker on the shared test server: two
corrupt a finished history and expect the checks to name it, two pin bugs the chaos run found.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from apps import taskq_chaos_app
from chaos import ChaosConfig, run_chaos
from chaos_checks import Planned, corrupt_one_row, run_checks
from chaos_fleet import FAULT_KINDS
from testkit import FAST_WINDOWS, query, running_worker, wait_for

from taskq import JobContext, JobsClient, sql
from taskq.actors.declaration import ActorRegistry, actor
from taskq.settings import WorkerSettings
from taskq.worker.main import Worker, worker_main_async
from taskq.worker.sweeper import Sweeper

TERMINAL = ("succeeded", "failed", "cancelled", "crashed", "abandoned")


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_chaos_run_under_every_kind_of_fault_keeps_every_invariant(
    ci_config: ChaosConfig, tmp_path: Path
) -> None:
    report = await run_chaos(ci_config, tmp_path)
    print(report.render())
    assert report.ok, report.render()
    injected = {kind: report.run[f"  fault {kind}"] for kind in FAULT_KINDS}
    assert all(injected.values()), f"a kind of fault was never injected: {injected}"
    statuses = report.invariants.jobs_by_status
    assert {"succeeded", "failed", "cancelled"} <= set(statuses), statuses
    assert report.run["operator cancels (status seen by cancel)"] > 0
    # the history was kept and checked, and every capability ran under the faults
    assert report.history is not None and report.history.figures["acknowledged enqueues (jobs)"] > 0
    assert report.history.violations == {}
    assert report.run["schedule slot jobs (one per second until paused)"] > 5
    for kind in ("capped", "durable", "fair", "limited", "paused", "requeue", "snooze"):
        assert f"{kind}: 0" not in report.run["capability jobs enqueued"], report.run["capability jobs enqueued"]
    assert not report.run["jobs requeued after failing / signals sent"].startswith("0 /")
    assert report.run["max running jobs of queue chaos-limited (limit 3)"] >= 1
    assert report.run["max holders of one unique key (limit 1)"] == 1


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_chaos_run_through_pgbouncer_in_transaction_mode_keeps_every_invariant(
    ci_config: ChaosConfig, tmp_path: Path
) -> None:
    # the fleet and the client through the pooler: no LISTEN, no prepared statements, the workers' identity
    # in application_name; the PostgreSQL restarts and outages happen behind PgBouncer
    ci_config.pgbouncer = True
    ci_config.jobs, ci_config.faults, ci_config.seconds = ci_config.jobs // 2, ci_config.faults // 2 + 1, 25.0
    report = await run_chaos(ci_config, tmp_path)
    print(report.render())
    assert report.ok, report.render()
    assert report.run["operator cancels (status seen by cancel)"] > 0


async def _run_small_workload(dsn: str, client: JobsClient, count: int) -> list[Planned]:
    """A few async and thread chaos jobs on an in-process worker, run to the end."""
    plan = [
        Planned(f"{i:05d}-small", "chaos.thread" if i % 2 else "chaos.async", {"key": f"{i:05d}-small",
                "children": 1 if i == 0 else 0, "fail_attempts": 1 if i == 1 else 0}, at=0.0)
        for i in range(count)
    ]
    async with running_worker(dsn, taskq_chaos_app.actors):
        for p in plan:
            p.job_id = (await client.enqueue(p.actor, p.work, max_attempts=3)).job_id

        async def all_terminal() -> bool:
            rows = query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status <> ALL(%s)", list(TERMINAL))
            return bool(rows[0][0] == 0)

        await wait_for(all_terminal, timeout=20)
    return plan


async def test_chaos_checks_name_a_stored_result_that_a_fenced_out_execution_produced(
    effects_dsn: str, client: JobsClient
) -> None:
    plan = await _run_small_workload(effects_dsn, client, 6)
    clean = await run_checks(effects_dsn, plan, {}, supervisor_code=0, stale_after=1.0)
    assert clean.ok, clean.render()
    assert clean.invariants.jobs_by_status == {"succeeded": 7}  # six, and the child of the first
    assert clean.run["executions (effects rows)"] == 8  # the second job failed once

    what = await corrupt_one_row(effects_dsn)
    corrupted = await run_checks(effects_dsn, plan, {}, supervisor_code=0, stale_after=1.0)
    assert not corrupted.ok, what
    assert {"result_is_final_execution", "no_fenced_out_result"} <= set(corrupted.violations), corrupted.render()
    assert "RESULT: FAIL" in corrupted.render()


async def test_chaos_checks_name_a_job_lost_a_phantom_cancel_and_an_unplanned_job(
    effects_dsn: str, client: JobsClient
) -> None:
    plan = await _run_small_workload(effects_dsn, client, 3)
    assert plan[2].job_id is not None
    async with await psycopg.AsyncConnection.connect(effects_dsn, autocommit=True) as conn:
        await conn.execute("UPDATE taskq.jobs SET status = 'cancelled', cancel_requested_at = now() "
                           "WHERE id = %s", (plan[2].job_id,))
    await client.enqueue("chaos.async", {"key": "nobody-planned-this"})
    report = await run_checks(effects_dsn, plan, {}, supervisor_code=15, stale_after=1.0)
    assert set(report.violations) >= {"drained", "accounted", "cancelled_by_operator", "supervisor_stopped"}, (
        report.render()
    )


async def test_a_retry_never_drops_an_operator_cancel_recorded_while_the_attempt_failed(
    dsn: str, client: JobsClient
) -> None:
    """Found by the chaos run: a cancel that committed while an attempt was failing, before its worker
    saw it, was overwritten by the retry (cancel_phase reset to 0), so the job ran again to success
    although the operator had been told the cancel was initiated."""
    registry = ActorRegistry()
    attempts: list[int] = []

    @actor(name="fails_while_cancelled", registry=registry, max_attempts=3)
    async def fails_while_cancelled(payload: int, ctx: JobContext[int]) -> int:
        attempts.append(ctx.attempt)
        if ctx.attempt == 1:
            # the request commits and the attempt fails with no await in between: the worker cannot
            # have seen the cancel when it decides the retry
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.query("job_cancel_request"), {"id": ctx.job_id, "reason": "operator"})
            raise ValueError("failed while the cancel was being requested")
        return payload

    async with running_worker(dsn, registry):
        handle = await client.enqueue(fails_while_cancelled, 1)

        async def finished() -> Any:
            row = await handle.refresh()
            return row if row.status in TERMINAL else None

        row = await wait_for(finished, timeout=10)
        await asyncio.sleep(0.3)  # a wrongly scheduled retry would be claimed within this
    assert (row.status, row.error_class, attempts) == ("cancelled", "CancelledCooperatively", [1])
    (outcome,) = query(dsn, "SELECT outcome, error_class FROM taskq.job_attempts WHERE job_id = %s",
                       handle.job_id)
    assert outcome == ("cancelled", "CancelledCooperatively")
    (detail,) = query(dsn, "SELECT detail FROM taskq.job_events WHERE job_id = %s "
                                   "AND to_status = 'cancelled'", handle.job_id)
    assert detail[0]["raised"] == "ValueError" and detail[0]["retry_dropped"] is True


async def test_a_worker_stops_even_when_a_service_loses_the_cancel_meant_to_stop_it(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the chaos run: on Python 3.11 a cancel that lands as asyncio.wait_for's inner wait
    completes is lost, and psycopg_pool waits for a pooled connection that way. A sweeper cancelled
    while the pool handed it a connection swept on forever, the worker never finished stopping, and its
    shutdown watchdog hard-exited the process (exit 13; in-process, the host process itself)."""
    lost = asyncio.Event()

    async def sweep_forever_losing_one_cancel(self: Sweeper) -> None:
        while True:
            try:
                await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                if lost.is_set():
                    raise
                lost.set()  # what wait_for does when the pool's connection arrives with the cancel

    monkeypatch.setattr(Sweeper, "run", sweep_forever_losing_one_cancel)
    settings = WorkerSettings(dsn=dsn, **(FAST_WINDOWS | {"shutdown_timeout": 60.0}))
    worker = Worker(settings, taskq_chaos_app.actors)
    task = asyncio.get_running_loop().create_task(
        worker_main_async(settings, taskq_chaos_app.actors, worker=worker, handle_signals=False)
    )
    try:
        await wait_for(worker.ready.is_set, timeout=10)
        worker.request_shutdown()
        done, _ = await asyncio.wait([task], timeout=5)
    finally:
        worker.watchdog.disarm()  # never let a hang here hard-exit the test process
        task.cancel()
    assert lost.is_set()
    assert done, "the worker did not stop: a service lost its cancel and kept running"
    assert task.result() == 0


async def test_a_signal_sent_while_the_suspending_finish_waits_for_the_row_wakes_the_job(
    dsn: str, client: JobsClient
) -> None:
    """Found by the chaos run (durable_completed: a job `scheduled` with its signal stored, waiting for its
    timeout). A signal whose sender holds the job's row lock while the attempt's suspending finish waits for
    it: the finish must see the signal once it gets the row (sql/jobs.sql says so) and make the job due at
    once. Here the sender is played by hand: the row lock is taken as the attempt suspends, the signal is
    sent in the same transaction once the worker's finish waits on the lock."""
    registry = ActorRegistry()
    holder = await psycopg.AsyncConnection.connect(dsn)

    @actor(name="waits_for_go", registry=registry, max_attempts=3)
    async def waits_for_go(payload: int, ctx: JobContext[int]) -> Any:
        try:
            return await ctx.wait_for_signal("go", timeout=60.0)
        except BaseException:
            if ctx.attempt == 1:  # the sender takes the row before the worker writes the suspension
                await holder.execute("SELECT 1 FROM taskq.jobs WHERE id = %s FOR NO KEY UPDATE", (ctx.job_id,))
            raise

    try:
        async with running_worker(dsn, registry, heartbeat_interval=5.0, lock_timeout=30.0):
            handle = await client.enqueue(waits_for_go, 1)

            def finish_waits_for_the_row() -> bool:  # no heartbeat in this window: the finish is the only writer
                return bool(query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                       "AND datname = current_database()")[0][0])

            await wait_for(finish_waits_for_the_row, timeout=10, interval=0.01)  # the finish gives up after 1 s
            await holder.execute(sql.query("signal_send"), {"job_id": handle.job_id, "name": "go",
                                                             "payload": '{"approved": true}', "sent_by": "test"})
            await holder.commit()

            async def succeeded() -> Any:
                row = await handle.refresh()
                return row if row.status == "succeeded" else None

            row = await wait_for(succeeded, timeout=5)
    finally:
        await holder.close()
    assert row.result == {"approved": True}
