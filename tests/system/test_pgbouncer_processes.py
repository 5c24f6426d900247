"""Worker and supervisor processes with every connection through a real PgBouncer in transaction mode:
jobs run, a cancel arrives with the heartbeat, and the jobs of a killed worker are reclaimed, by the
sweeper of another worker and by the supervisor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_supervisor import (
    attempts,
    job,
    reclaim_causes,
    start_supervisor,  # noqa: F401 (a fixture)
)
from testkit import insert_job as enqueue
from testkit import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

POOLED: dict[str, Any] = {"transaction_pooler": "true"}


def test_a_killed_pooled_worker_job_is_reclaimed_by_another_pooled_workers_sweeper(
    dsn: str, pooled_dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    w1 = spawn_worker(dsn=pooled_dsn, **POOLED)
    w1_id = w1.worker_id()
    # attempt 1 waits for a gate that never opens (still running when the kill comes); attempt 2 returns
    job_id = enqueue(dsn, "test.gated", {"path": str(tmp_path / "never-opened")})
    # no LISTEN through the pooler: the worker finds the job by polling (poll_interval 0.2 s)
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id and job(dsn, job_id)["status"] == "running")
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    w2 = spawn_worker(dsn=pooled_dsn, **POOLED)
    w2_id = w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=30)
    assert job(dsn, job_id)["attempt"] == 2 and job(dsn, job_id)["worker_id"] == w2_id
    assert [(a[0], a[1], a[2]) for a in attempts(dsn, job_id)] == [(1, "crashed", "WorkerCrashed"),
                                                                  (2, "succeeded", None)]
    assert "unsupported startup parameter" not in w2.log()


def test_a_pooled_worker_process_acts_on_a_cancel_it_hears_of_with_the_heartbeat(
    dsn: str, pooled_dsn: str, spawn_worker: Any
) -> None:
    w = spawn_worker(dsn=pooled_dsn, **POOLED)
    w_id = w.worker_id()
    job_id = enqueue(dsn, "test.sleep_hooked", {"seconds": 60})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w_id and job(dsn, job_id)["status"] == "running")
    # the operator's cancel from the CLI, through the pooler too (its NOTIFY reaches no one: no LISTEN)
    cancel = subprocess.run([sys.executable, "-m", "taskq.cli", "--dsn", pooled_dsn, "cancel", str(job_id)],
                            env=os.environ | {"TASKQ_TRANSACTION_POOLER": "1"}, capture_output=True, text=True,
                            timeout=30)
    assert cancel.returncode == 0, cancel.stderr
    wait_until(lambda: job(dsn, job_id)["status"] == "cancelled", timeout=20)
    assert job(dsn, job_id)["error_class"] in ("CancelledCooperatively", "CancelledForced")


def test_a_supervisor_and_its_workers_run_through_pgbouncer_and_reclaim_a_killed_worker_at_once(
    start_supervisor: Any, dsn: str, pooled_dsn: str, tmp_path: Path  # noqa: F811
) -> None:
    sup = start_supervisor(lock_timeout=30, heartbeat_interval=1, sweep_interval=30, poll_interval=0.2,
                           env={"TASKQ_DSN": pooled_dsn, "TASKQ_TRANSACTION_POOLER": "1"})
    sup.notify.wait_for("READY")
    ids = [enqueue(dsn, "test.noop", i) for i in range(30)]
    wait_until(lambda: all(job(dsn, i)["status"] == "succeeded" for i in ids), timeout=30)
    job_id = enqueue(dsn, "test.gated", {"path": str(tmp_path / "never-opened")})
    wait_until(lambda: job(dsn, job_id)["status"] == "running", timeout=20)
    holder = next(pid for pid, wid in sup.registered().items() if wid == job(dsn, job_id)["worker_id"])
    os.kill(holder, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: reclaim_causes(dsn, job_id) == ["worker_died"], timeout=20)
    assert time.monotonic() - killed_at < 10, "reclaimed by lock expiry (30 s), not by the supervisor"
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=30)
    assert "unsupported startup parameter" not in sup.log()
    sup.signal(signal.SIGTERM)
    assert sup.wait(30) == 0


def test_a_worker_pointed_at_a_transaction_pooler_without_the_setting_says_which_setting_to_turn_on(
    pooled_dsn: str, spawn_worker: Any
) -> None:
    """PgBouncer refuses the worker's startup options (`FATAL: unsupported startup parameter: options`): the
    worker exits at once with the database-unavailable code and a line naming the setting, not a stack."""
    w = spawn_worker(dsn=pooled_dsn)
    assert w.wait(30) == 3, w.log()
    lines = [line for line in w.log().splitlines() if "transaction_pooler" in line]
    assert lines and "TASKQ_TRANSACTION_POOLER=1" in lines[0], w.log()
    assert "Traceback" not in w.log()
