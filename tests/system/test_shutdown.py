"""Shutdown orchestration with real worker processes and real signals (spec §4, §9, §11)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from testkit import query, wait_until

from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def enqueue(dsn: str, actor: str, payload: Any, *, max_attempts: int = 3, deadline_s: float | None = None) -> UUID:
    (row,) = query(
        dsn,
        "INSERT INTO taskq.jobs (actor, payload, max_attempts, schedule_to_close) VALUES "
        "(%s, %s::jsonb, %s, now() + %s::float8 * interval '1 second') RETURNING id",
        actor, json.dumps(payload), max_attempts, deadline_s,
    )
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return UUID(str(row[0]))


def row(dsn: str, job_id: UUID) -> dict[str, Any]:
    cols = ["status", "attempt", "worker_id", "error_class", "interrupt_count", "progress", "cancel_requested_at",
            "result"]
    (values,) = query(dsn, f"SELECT {', '.join(cols)} FROM taskq.jobs WHERE id = %s", job_id)
    return dict(zip(cols, values, strict=True))


def running_on(dsn: str, job_id: UUID, worker_id: str) -> bool:
    r = row(dsn, job_id)
    return bool(r["status"] == "running" and r["worker_id"] == worker_id)


def test_sigterm_mid_job_releases_it_and_another_worker_finishes_it_at_attempt_two(
    dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    hook_file = tmp_path / "hooks"
    w1 = spawn_worker(shutdown_timeout=5.0)
    w1_id = w1.worker_id()
    # attempt 1 sleeps a minute, so it is still running when the SIGTERM comes, however long seeing it
    # running takes; attempt 2 returns at once
    job_id = enqueue(dsn, "test.sleep_hooked", {"seconds": 60.0})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    started = time.monotonic()
    w1.signal(signal.SIGTERM)
    assert w1.wait(10) == exitcodes.OK
    assert time.monotonic() - started < 5.0  # within the watchdog budget
    r = row(dsn, job_id)
    assert (r["status"], r["interrupt_count"], r["attempt"], r["cancel_requested_at"]) == ("pending", 1, 1, None)
    assert "released=['" + str(job_id) in w1.log()
    w2 = spawn_worker()
    w2.worker_id()
    wait_until(lambda: row(dsn, job_id)["status"] == "succeeded", timeout=20)
    assert row(dsn, job_id)["attempt"] == 2
    assert not hook_file.exists()  # no on_cancel for a shutdown interruption


def test_sigterm_while_an_operator_cancel_is_pending_ends_cancelled(dsn: str, spawn_worker: Any) -> None:
    # a long cooperative grace: the operator's request is still pending when the deploy arrives
    w1 = spawn_worker(cancellation_grace_period=30.0, cleanup_grace_period=0.5, shutdown_timeout=60.0)
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    query(dsn, "UPDATE taskq.jobs SET cancel_phase = 1, cancel_requested_at = now() WHERE id = %s", job_id)
    query(dsn, "SELECT pg_notify('taskq_cancel', %s)", f"{job_id}:1:1:{w1_id}")
    wait_until(lambda: "cancel phase 0 -> 1" in w1.log())
    # the shutdown's own grace (30 s) is too long to wait for: a second SIGINT skips it
    w1.signal(signal.SIGINT)
    wait_until(lambda: "shutting down" in w1.log())
    w1.signal(signal.SIGINT)
    assert w1.wait(20) == exitcodes.OK
    r = row(dsn, job_id)
    assert r["status"] == "cancelled" and r["error_class"] == "CancelledForced"


def test_actor_checkpointing_on_shutdown_leaves_its_progress_on_the_released_row(
    dsn: str, spawn_worker: Any
) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.checkpointing", {"steps": 1000})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    # it has made some progress (any amount > 0 steps works): its first step is done
    wait_until(lambda: (row(dsn, job_id)["progress"] or {}).get("message") == "under way")
    w1.signal(signal.SIGTERM)
    assert w1.wait(10) == exitcodes.OK
    r = row(dsn, job_id)
    assert r["status"] == "pending" and r["interrupt_count"] == 1
    assert r["progress"]["message"] == "interrupted by shutdown" and r["progress"]["data"]["step"] > 0
    w2 = spawn_worker()
    w2.worker_id()
    wait_until(lambda: row(dsn, job_id)["status"] == "succeeded", timeout=60)
    assert row(dsn, job_id)["result"]["resumed_from"] == r["progress"]["data"]["step"]


def test_thread_blocked_in_c_is_ended_by_the_watchdog_and_later_reclaimed_not_cancelled(
    dsn: str, spawn_worker: Any
) -> None:
    w1 = spawn_worker(shutdown_timeout=2.0, cancellation_grace_period=0.3, cleanup_grace_period=0.3)
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.blocked_in_c", 6.0)
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    started = time.monotonic()
    w1.signal(signal.SIGTERM)
    assert w1.wait(10) == exitcodes.WATCHDOG
    assert time.monotonic() - started < 2.0 + 1.0
    assert "shutdown watchdog" in w1.log()
    r = row(dsn, job_id)
    assert r["status"] == "running" and r["cancel_requested_at"] is None  # never released nor cancelled
    w2 = spawn_worker()
    w2.worker_id()
    first_attempt = "SELECT outcome, error_class FROM taskq.job_attempts WHERE job_id = %s AND attempt = 1"
    wait_until(lambda: query(dsn, first_attempt, job_id)[0][0] is not None, timeout=20)
    assert query(dsn, first_attempt, job_id)[0] == ("crashed", "WorkerCrashed")
    assert row(dsn, job_id)["status"] != "cancelled"


def test_deadline_passed_at_release_ends_failed_with_deadline_exceeded(dsn: str, spawn_worker: Any) -> None:
    w1 = spawn_worker(cancellation_grace_period=1.5, cleanup_grace_period=0.3)
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False}, deadline_s=1.0)
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    w1.signal(signal.SIGTERM)
    assert w1.wait(15) == exitcodes.OK
    r = row(dsn, job_id)
    assert r["status"] == "failed" and r["error_class"] == "DeadlineExceeded"
