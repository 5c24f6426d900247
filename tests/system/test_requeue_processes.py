"""Requeue with real worker processes and real signals: a zombie from before the requeue stays fenced out."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from testkit import insert_job as enqueue
from testkit import query, wait_until

from taskq.invariants import InvariantReport, check_invariants
from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]




def job(dsn: str, job_id: UUID) -> dict[str, Any]:
    (row,) = query(dsn, "SELECT status, attempt, claim_epoch, worker_id, error_class, result, requeue_count "
                        "FROM taskq.jobs WHERE id = %s", job_id)
    keys = ("status", "attempt", "claim_epoch", "worker_id", "error_class", "result", "requeue_count")
    return dict(zip(keys, row, strict=True))


def taskq_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"TASKQ_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_a_sigstopped_zombie_from_before_the_requeue_cannot_write_over_the_rerun(
    dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    zombie = spawn_worker()
    zombie_id = zombie.worker_id()
    # test.gated: attempt 1 waits for the gate file, later attempts return {"attempt": n} at once
    job_id = enqueue(dsn, "test.gated", {"path": str(gate)}, max_attempts=1)
    wait_until(lambda: job(dsn, job_id)["worker_id"] == zombie_id and job(dsn, job_id)["status"] == "running")
    zombie.signal(signal.SIGSTOP)
    rescuer = spawn_worker()
    rescuer_id = rescuer.worker_id()
    # the rescuer's sweeper reclaims the frozen worker's expired lease: no attempts left, so crashed
    wait_until(lambda: job(dsn, job_id)["status"] == "crashed", timeout=30)
    assert job(dsn, job_id)["error_class"] == "WorkerCrashed"

    requeued = taskq_cli(dsn, "requeue", str(job_id), "--reason", "worker host fixed")
    assert requeued.returncode == 0, requeued.stderr
    assert "crashed -> pending, requeued=true" in requeued.stdout

    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=30)
    rerun = job(dsn, job_id)
    assert rerun["worker_id"] == rescuer_id and rerun["attempt"] == 2 and rerun["claim_epoch"] == 2
    assert rerun["result"] == {"attempt": 2} and rerun["requeue_count"] == 1

    gate.write_text("open")
    zombie.signal(signal.SIGCONT)
    # resumed, the zombie's attempt 1 finishes; its fenced write (attempt 1, epoch 1) matches nothing
    wait_until(lambda: "stale write ignored" in zombie.log(), timeout=30)
    assert job(dsn, job_id) == rerun
    history = query(dsn, "SELECT attempt, claim_epoch, outcome FROM taskq.job_attempts WHERE job_id = %s "
                         "ORDER BY claim_epoch", job_id)
    assert history == [(1, 1, "crashed"), (2, 2, "succeeded")]
    kinds = [k for (k,) in query(dsn, "SELECT kind FROM taskq.job_events WHERE job_id = %s ORDER BY id", job_id)]
    assert kinds.count("requeued") == 1
    zombie.signal(signal.SIGTERM)
    rescuer.signal(signal.SIGTERM)
    assert zombie.wait(15) == exitcodes.OK and rescuer.wait(15) == exitcodes.OK
    report = asyncio.run(invariants(dsn))
    assert report.ok, report.render()


async def invariants(dsn: str) -> InvariantReport:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await check_invariants(conn, stale_after=0)
