"""Worker processes killed, frozen and stopped with real signals against a real PostgreSQL."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from testkit import insert_job as enqueue
from testkit import query, wait_until

from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]




def job(dsn: str, job_id: UUID) -> dict[str, Any]:
    with_names = query(
        dsn, "SELECT status, attempt, worker_id, error_class, result, cancel_requested_at FROM taskq.jobs "
             "WHERE id = %s", job_id,
    )
    status, attempt, worker_id, error_class, result, cancel_requested_at = with_names[0]
    return {"status": status, "attempt": attempt, "worker_id": worker_id, "error_class": error_class,
            "result": result, "cancel_requested_at": cancel_requested_at}


def attempts(dsn: str, job_id: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT attempt, worker_id, outcome, error_class FROM taskq.job_attempts "
                      "WHERE job_id = %s ORDER BY claim_epoch", job_id)


def test_killed_worker_job_is_reclaimed_within_lock_timeout_plus_sweep_and_run_again(
    dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    # attempt 1 waits for a gate that never opens, so it is still running when the kill comes, however
    # long seeing it running takes; attempt 2 returns at once
    job_id = enqueue(dsn, "test.gated", {"path": str(tmp_path / "never-opened")})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id and job(dsn, job_id)["status"] == "running")
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    killed_at = time.monotonic()
    w2 = spawn_worker()
    w2_id = w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=20)
    row = job(dsn, job_id)
    assert row["attempt"] == 2 and row["worker_id"] == w2_id
    history = attempts(dsn, job_id)
    assert [(a[0], a[2], a[3]) for a in history] == [(1, "crashed", "WorkerCrashed"), (2, "succeeded", None)]
    # reclaim (lock 1.0 s + sweep 0.3 s + retry backoff 1 s) and the rerun, with slack for a busy box
    assert time.monotonic() - killed_at < 10


def test_killed_worker_with_no_attempts_left_ends_crashed(dsn: str, spawn_worker: Any) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep_once", {"seconds": 30}, max_attempts=1)
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id)
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    spawn_worker().worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "crashed", timeout=20)
    assert job(dsn, job_id)["error_class"] == "WorkerCrashed"
    assert [a[2] for a in attempts(dsn, job_id)] == ["crashed"]


def test_cancel_requested_then_worker_killed_ends_cancelled_with_null_marker(dsn: str, spawn_worker: Any) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id)
    w1.signal(signal.SIGSTOP)  # freeze it so the cancel cannot be honoured by the worker itself
    query(dsn, "UPDATE taskq.jobs SET cancel_phase = 1, cancel_requested_at = now() WHERE id = %s", job_id)
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    spawn_worker().worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "cancelled", timeout=20)
    row = job(dsn, job_id)
    assert row["error_class"] is None and row["cancel_requested_at"] is not None
    assert [(a[2], a[3]) for a in attempts(dsn, job_id)] == [("crashed", "WorkerCrashed")]


def test_frozen_worker_late_write_is_fenced_out_and_counted(dsn: str, spawn_worker: Any, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.gated", {"path": str(gate)})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id and job(dsn, job_id)["status"] == "running")
    w1.signal(signal.SIGSTOP)
    w2 = spawn_worker()
    w2_id = w2.worker_id()
    # w2's sweeper reclaims the expired lease; attempt 2 runs on w2 and does not wait for the gate
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=20)
    assert job(dsn, job_id)["worker_id"] == w2_id
    gate.write_text("open")
    w1.signal(signal.SIGCONT)
    # resumed, the zombie's actor finishes first and its fenced write is refused and counted
    wait_until(lambda: "stale write ignored" in w1.log(), timeout=15)
    row = job(dsn, job_id)
    assert row["status"] == "succeeded" and row["attempt"] == 2 and row["result"] == {"attempt": 2}
    assert [(a[0], a[2]) for a in attempts(dsn, job_id)] == [(1, "crashed"), (2, "succeeded")]
    w1.signal(signal.SIGTERM)
    assert w1.wait(15) == exitcodes.OK


def test_two_workers_run_each_of_2000_jobs_exactly_once(dsn: str, spawn_worker: Any) -> None:
    query(dsn, "INSERT INTO taskq.jobs (actor, payload) "
               "SELECT 'test.noop', to_jsonb(g) FROM generate_series(1, 2000) g")
    workers = [spawn_worker(concurrency=50), spawn_worker(concurrency=50)]
    ids = {w.worker_id() for w in workers}
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'")[0][0] == 2000,
               timeout=60)
    per_job = query(dsn, "SELECT job_id, count(*) FROM taskq.job_attempts GROUP BY job_id HAVING count(*) <> 1")
    assert per_job == []
    assert query(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE outcome = 'succeeded'")[0][0] == 2000
    by_worker = dict(query(dsn, "SELECT worker_id, count(*) FROM taskq.job_attempts GROUP BY worker_id"))
    assert set(by_worker) <= ids
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE result <> payload")[0][0] == 0
    for w in workers:
        w.signal(signal.SIGTERM)
    assert [w.wait(15) for w in workers] == [exitcodes.OK, exitcodes.OK]


def test_sigterm_releases_in_flight_job_and_exits_zero(dsn: str, spawn_worker: Any) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id)
    w1.signal(signal.SIGTERM)
    assert w1.wait(15) == exitcodes.OK
    row = job(dsn, job_id)
    assert row["status"] == "pending" and row["attempt"] == 1 and row["cancel_requested_at"] is None
    assert [a[2] for a in attempts(dsn, job_id)] == ["interrupted"]
    assert query(dsn, "SELECT interrupt_count FROM taskq.jobs WHERE id = %s", job_id)[0][0] == 1
