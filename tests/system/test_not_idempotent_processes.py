"""`@actor(idempotent=False)` with real worker processes and real signals: an attempt whose effect is
unknown (its worker was killed or frozen past its lease, or a shutdown had to force it) is never re-run
automatically; the job ends crashed, attempts remaining, for an operator to requeue."""

from __future__ import annotations

import signal
import time
from typing import Any
from uuid import UUID

import pytest
from testkit import insert_job as enqueue_by_name
from testkit import query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]




def job(dsn: str, job_id: UUID) -> dict[str, Any]:
    cols = ("status", "attempt", "max_attempts", "claim_epoch", "worker_id", "error_class", "error_message",
            "idempotent", "interrupt_count")
    (row,) = query(dsn, f"SELECT {', '.join(cols)} FROM taskq.jobs WHERE id = %s", job_id)
    return dict(zip(cols, row, strict=True))


def attempts(dsn: str, job_id: UUID) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = query(
        dsn, "SELECT attempt, outcome, error_class FROM taskq.job_attempts WHERE job_id = %s ORDER BY claim_epoch",
        job_id,
    )
    return rows


def running_on(dsn: str, job_id: UUID, worker_id: str) -> bool:
    row = job(dsn, job_id)
    return bool(row["status"] == "running" and row["worker_id"] == worker_id and row["idempotent"] is False)


def test_kill_9_mid_job_ends_a_non_idempotent_job_crashed_with_attempts_remaining(
    dsn: str, spawn_worker: Any
) -> None:
    job_id = enqueue_by_name(dsn, "test.charge", {"seconds": 30})
    assert job(dsn, job_id)["idempotent"] is True  # the producer did not know the actor
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    # the worker records the actor's idempotent=False on the row before it runs it
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    w2 = spawn_worker()
    w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "crashed", timeout=20)
    row = job(dsn, job_id)
    assert (row["error_class"], row["attempt"], row["max_attempts"]) == ("WorkerCrashed", 1, 3)
    assert "not idempotent" in row["error_message"]
    assert attempts(dsn, job_id) == [(1, "crashed", "WorkerCrashed")]
    # and nobody runs it again: a second sweep leaves it alone
    time.sleep(1.0)  # a negative check: a few sweeps of w2 (0.3 s apart) must change nothing
    assert job(dsn, job_id)["status"] == "crashed" and len(attempts(dsn, job_id)) == 1


def test_a_frozen_worker_that_lost_its_lease_does_not_get_its_non_idempotent_job_rerun(
    dsn: str, spawn_worker: Any
) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue_by_name(dsn, "test.charge", {"seconds": 30})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    w1.signal(signal.SIGSTOP)
    try:
        w2 = spawn_worker()
        w2.worker_id()
        wait_until(lambda: job(dsn, job_id)["status"] == "crashed", timeout=20)
    finally:
        w1.signal(signal.SIGCONT)
    row = job(dsn, job_id)
    assert (row["error_class"], row["attempt"], row["claim_epoch"]) == ("WorkerCrashed", 1, 1)
    # the thawed worker finds the row taken and stops the actor without writing anything
    wait_until(lambda: "lease lost" in w1.log(), timeout=20)
    w1.signal(signal.SIGTERM)
    w1.wait(20)
    assert job(dsn, job_id)["status"] == "crashed" and attempts(dsn, job_id) == [(1, "crashed", "WorkerCrashed")]


def test_a_shutdown_that_must_force_a_non_idempotent_actor_ends_it_crashed(dsn: str, spawn_worker: Any) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue_by_name(dsn, "test.charge", {"seconds": 30, "cooperative": False})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    w1.signal(signal.SIGTERM)
    assert w1.wait(20) == 0, w1.log()
    row = job(dsn, job_id)
    assert (row["status"], row["error_class"], row["attempt"], row["interrupt_count"]) == (
        "crashed", "WorkerShutdown", 1, 0)
    assert attempts(dsn, job_id) == [(1, "crashed", "WorkerShutdown")]
    assert "non-idempotent" in w1.log()


def test_a_shutdown_releases_a_non_idempotent_actor_that_stops_on_its_cancel_event(
    dsn: str, spawn_worker: Any
) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    job_id = enqueue_by_name(dsn, "test.charge", {"seconds": 30, "cooperative": True})
    wait_until(lambda: running_on(dsn, job_id, w1_id))
    w1.signal(signal.SIGTERM)
    assert w1.wait(20) == 0, w1.log()
    row = job(dsn, job_id)
    assert (row["status"], row["attempt"], row["interrupt_count"]) == ("pending", 1, 1)
    assert attempts(dsn, job_id) == [(1, "interrupted", "WorkerShutdown")]
