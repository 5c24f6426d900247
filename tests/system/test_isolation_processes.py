"""Thread and process isolation in real worker processes: kill -9, a leaked thread, the CPU examples."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
import pytest
from testkit import query, wait_until

from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

REPO_ROOT = Path(__file__).resolve().parents[2]
APP = "taskq_isolation_app:actors"


def enqueue(dsn: str, actor: str, payload: Any) -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES (%s, %s::jsonb) RETURNING id",
                   actor, json.dumps(payload))
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return UUID(str(row[0]))


def row(dsn: str, job_id: UUID) -> dict[str, Any]:
    ((status, error_class, result, progress, interrupt_count),) = query(
        dsn, "SELECT status, error_class, result, progress, interrupt_count FROM taskq.jobs WHERE id = %s",
        job_id,
    )
    return {"status": status, "error_class": error_class, "result": result, "progress": progress,
            "interrupt_count": interrupt_count}


def started(dsn: str, job_id: UUID) -> bool:
    progress = row(dsn, job_id)["progress"]
    return isinstance(progress, dict) and progress.get("message") == "started"


def running_in_group(pgid: int) -> list[int]:
    """Processes of this process group that still run (an orphan would; a zombie no longer does)."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, ProcessLookupError):
            continue
    return found


def test_kill_9_of_a_worker_leaves_no_orphan_child(dsn: str, spawn_worker: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    worker = spawn_worker(app=APP)
    worker.worker_id()
    enqueue(dsn, "iso.proc.deaf", {"seconds": 60, "path": str(pid_file)})
    wait_until(lambda: pid_file.exists() and pid_file.read_text())
    child = int(pid_file.read_text())
    assert psutil.Process(child).ppid() == worker.pid and running_in_group(child) == [child]
    worker.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    worker.wait(10)
    wait_until(lambda: running_in_group(child) == [], timeout=5, interval=0.01)
    assert time.monotonic() - killed_at < 1.0, "the child outlived its worker by more than a second"


def test_thread_stuck_in_sleep_is_abandoned_and_the_worker_restarts_itself_releasing_its_other_jobs(
    dsn: str, spawn_worker: Any
) -> None:
    worker = spawn_worker(app=APP, max_leaked_threads=0)
    worker.worker_id()
    bystander = enqueue(dsn, "iso.async.waits", 600)
    stuck = enqueue(dsn, "iso.thread.sleeps", {"seconds": 10**6})
    wait_until(lambda: started(dsn, stuck) and started(dsn, bystander))
    query(dsn, "UPDATE taskq.jobs SET cancel_phase = 1, cancel_requested_at = now() WHERE id = %s", stuck)
    assert worker.wait(20) == exitcodes.LEAKED_THREADS, worker.log()
    assert row(dsn, stuck)["status"] == "abandoned" and row(dsn, stuck)["error_class"] == "CancelAbandoned"
    other = row(dsn, bystander)
    assert other["status"] == "pending" and other["interrupt_count"] == 1
    assert "actor threads leaked" in worker.log()


def test_cpu_examples_run_in_a_thread_and_in_a_child_process(
    dsn: str, spawn_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO_ROOT)  # `python -m taskq.worker` imports examples/ from its working directory
    worker = spawn_worker(app="examples.cpu:actors")
    worker.worker_id()
    jobs = {name: enqueue(dsn, f"examples.cpu.{name}", {"below": 20000, "report_every": 10000})
            for name in ("primes_thread", "primes_process")}
    wait_until(lambda: all(row(dsn, j)["status"] == "succeeded" for j in jobs.values()), timeout=30)
    results = {name: row(dsn, j)["result"] for name, j in jobs.items()}
    assert results["primes_thread"]["count"] == results["primes_process"]["count"] == 2262
    assert results["primes_thread"]["pid"] == worker.pid and results["primes_process"]["pid"] != worker.pid
    assert row(dsn, jobs["primes_process"])["progress"]["data"] == {"checked": 20000, "count": 2262}
    worker.signal(signal.SIGTERM)
    assert worker.wait(15) == exitcodes.OK
