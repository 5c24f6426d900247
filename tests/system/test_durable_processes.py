"""Durable jobs across real worker processes and signals (issue 32): a kill -9 during a step, a worker
SIGSTOPped past its lease during a step or inside ctx.transaction(), a rolling restart (SIGHUP) of a
supervisor during a ten-step job. Completed steps never run again; a stale attempt stores nothing."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from test_supervisor import start_supervisor  # noqa: F401  (the fixture)
from testkit import query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = "taskq_durable_app:actors"


@pytest.fixture
def effects_table(dsn: str) -> None:
    query(dsn, "CREATE TABLE IF NOT EXISTS public.durable_effects (job_id uuid, step text, attempt int)")


def enqueue(dsn: str, actor: str, payload: dict[str, Any]) -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES (%s, %s::jsonb) RETURNING id",
                   actor, json.dumps(payload))
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return UUID(str(row[0]))


def effects(dsn: str, job_id: UUID) -> list[tuple[str, int]]:
    return [(s, a) for s, a in query(
        dsn, "SELECT step, attempt FROM public.durable_effects WHERE job_id = %s AND step NOT LIKE 'enter-%%' "
             "ORDER BY step, attempt", job_id)]


def entered(dsn: str, job_id: UUID, step: str, attempt: int = 1) -> bool:
    return bool(query(dsn, "SELECT 1 FROM public.durable_effects WHERE job_id = %s AND step = %s AND attempt = %s",
                      job_id, f"enter-{step}", attempt))


def stored(dsn: str, job_id: UUID) -> dict[str, int]:
    return {name: attempt for name, attempt in query(
        dsn, "SELECT name, attempt FROM taskq.job_steps WHERE job_id = %s AND kind = 'step'", job_id)}


def status(dsn: str, job_id: UUID) -> tuple[str, Any]:
    ((st, result),) = query(dsn, "SELECT status, result FROM taskq.jobs WHERE id = %s", job_id)
    return st, result


def no_violations(dsn: str) -> None:
    import asyncio

    import psycopg

    from taskq.invariants import check_invariants

    async def check() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return await check_invariants(conn, stale_after=0)

    report = asyncio.run(check())
    assert report.violations == [], report.render()


@pytest.mark.parametrize("isolation", ["async", "thread", "process"])
def test_kill_9_during_step_3_reruns_only_steps_3_and_4(dsn: str, spawn_worker: Any, tmp_path: Path,
                                                        effects_table: None, isolation: str) -> None:
    gate = tmp_path / "gate"
    first = spawn_worker(app=APP)
    first.worker_id()
    job = enqueue(dsn, f"durable.{isolation}", {"steps": 4, "block_at": 3, "gate": str(gate)})
    wait_until(lambda: entered(dsn, job, "3"), timeout=30)
    assert effects(dsn, job) == [("1", 1), ("2", 1)]
    first.signal(signal.SIGKILL)
    first.wait(10)
    gate.touch()
    second = spawn_worker(app=APP)
    second.worker_id()
    wait_until(lambda: status(dsn, job)[0] == "succeeded", timeout=60)
    assert status(dsn, job)[1] == [10, 20, 30, 40]
    # steps 1 and 2 were not executed again; 3 (cut short before its effect) and 4 ran once, on the rerun
    assert effects(dsn, job) == [("1", 1), ("2", 1), ("3", 2), ("4", 2)]
    assert stored(dsn, job) == {"1": 1, "2": 1, "3": 2, "4": 2}
    no_violations(dsn)


def test_a_worker_stopped_past_its_lease_cannot_store_its_step_or_finish(dsn: str, spawn_worker: Any,
                                                                         tmp_path: Path, effects_table: None) -> None:
    gate = tmp_path / "gate"
    first = spawn_worker(app=APP)
    first.worker_id()
    job = enqueue(dsn, "durable.async", {"steps": 4, "block_at": 2, "gate": str(gate)})
    wait_until(lambda: entered(dsn, job, "2"), timeout=30)
    first.signal(signal.SIGSTOP)
    try:
        second = spawn_worker(app=APP)
        second.worker_id()
        wait_until(lambda: status(dsn, job)[0] == "succeeded", timeout=60)  # reclaimed and rerun on the second
        gate.touch()  # the first's step 2 may now finish its work and try to store it
    finally:
        first.signal(signal.SIGCONT)
    wait_until(lambda: ("2", 1) in effects(dsn, job), timeout=30)
    wait_until(lambda: "no longer holds the job" in first.log() or "lease lost" in first.log(), timeout=30)
    ((attempt, epoch),) = query(dsn, "SELECT attempt, claim_epoch FROM taskq.jobs WHERE id = %s", job)
    assert (status(dsn, job), attempt, epoch) == (("succeeded", [10, 20, 30, 40]), 2, 2)
    # the stale attempt's step 2 ran (its effect is there) but was not stored: every stored step's effect
    # is there exactly once, from the attempt that stored it
    steps = stored(dsn, job)
    assert steps == {"1": 1, "2": 2, "3": 2, "4": 2}
    done = effects(dsn, job)
    for name, by in steps.items():
        assert done.count((name, by)) == 1, done
    assert done == [("1", 1), ("2", 1), ("2", 2), ("3", 2), ("4", 2)]
    ((finishes,),) = query(dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s AND to_status = 'succeeded'",
                           job)
    assert finishes == 1
    no_violations(dsn)


def test_transaction_of_a_worker_stopped_past_its_lease_commits_nothing(dsn: str, spawn_worker: Any,
                                                                        tmp_path: Path, effects_table: None) -> None:
    gate = tmp_path / "gate"
    first = spawn_worker(app=APP)
    first.worker_id()
    job = enqueue(dsn, "durable.tx", {"gate": str(gate)})
    wait_until(lambda: entered(dsn, job, "tx"), timeout=30)
    first.signal(signal.SIGSTOP)
    try:
        second = spawn_worker(app=APP)
        second.worker_id()
        wait_until(lambda: status(dsn, job)[0] == "succeeded", timeout=60)
        gate.touch()
    finally:
        first.signal(signal.SIGCONT)
    # the first attempt's transaction ends (rolled back) once it resumes; its row never commits
    wait_until(lambda: not query(dsn, "SELECT 1 FROM pg_stat_activity WHERE state LIKE 'idle in transaction%%' "
                                      "AND query LIKE '%%durable_effects%%'"), timeout=30)
    assert status(dsn, job) == ("succeeded", 2)
    assert [(s, a) for s, a in query(dsn, "SELECT step, attempt FROM public.durable_effects WHERE job_id = %s "
                                          "AND step = 'tx'", job)] == [("tx", 2)]
    no_violations(dsn)


def test_rolling_restart_resumes_a_ten_step_job_after_its_completed_steps(
        dsn: str, start_supervisor: Any, effects_table: None) -> None:  # noqa: F811
    sup = start_supervisor(app=APP, workers=1)
    sup.notify.wait_for("READY")
    sup.wait_registered(1)
    job = enqueue(dsn, "durable.async", {"steps": 10, "step_seconds": 0.3})
    wait_until(lambda: len(stored(dsn, job)) >= 4, timeout=30)
    sup.signal(signal.SIGHUP)
    wait_until(lambda: status(dsn, job)[0] == "succeeded", timeout=90)
    assert status(dsn, job)[1] == [n * 10 for n in range(1, 11)]
    steps = stored(dsn, job)
    assert sorted(steps, key=int) == [str(n) for n in range(1, 11)]
    assert max(steps.values()) >= 2, "the job was not released and resumed by a new worker"
    done = effects(dsn, job)
    for name, by in steps.items():  # a stored step ran once on the attempt that stored it...
        assert done.count((name, by)) == 1, done
    # ...and no step stored by the first attempt ran again on the second
    for name, by in steps.items():
        if by == 1:
            assert [a for s, a in done if s == name] == [1], done
    no_violations(dsn)


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_thread_and_process_actors_sleep_and_wait_for_a_signal(dsn: str, spawn_worker: Any,
                                                                effects_table: None, isolation: str) -> None:
    worker = spawn_worker(app=APP)
    worker.worker_id()
    job = enqueue(dsn, f"durable.{isolation}_suspends", {})

    def suspended(kind: str) -> bool:
        return bool(query(dsn, "SELECT 1 FROM taskq.jobs WHERE id = %s AND status = 'scheduled' AND wait_kind = %s",
                          job, kind))

    wait_until(lambda: suspended("sleep"), timeout=30)
    wait_until(lambda: suspended("signal"), timeout=30)  # the sleep ended, the rerun waits for the signal
    ((worker_id, lease),) = query(dsn, "SELECT worker_id, lock_expires_at FROM taskq.jobs WHERE id = %s", job)
    assert (worker_id, lease) == (None, None)
    import asyncio

    from taskq.client import JobsClient

    async def send() -> None:
        async with await JobsClient.connect(dsn) as client:
            assert (await client.signal(job, "go", {"ok": True})).woke

    asyncio.run(send())
    wait_until(lambda: status(dsn, job)[0] == "succeeded", timeout=30)
    assert status(dsn, job)[1] == [10, {"ok": True}, 3]
    assert effects(dsn, job) == [("1", 1)]  # the step ran once, on the first attempt
    no_violations(dsn)
