"""Real worker processes for the system tests: spawned with `python -m taskq.worker`, signalled for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

APPS = str(Path(__file__).resolve().parent.parent / "apps")

PROCESS_WINDOWS: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "lock_timeout": 1.0,
    "poll_interval": 0.2,
    "sweep_interval": 0.3,
    "cancellation_grace_period": 0.5,
    "cleanup_grace_period": 0.5,
}


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log_path: Path, dsn: str) -> None:
        self.proc = proc
        self.log_path = log_path
        self.dsn = dsn

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_id(self, timeout: float = 15.0) -> str:
        """Wait until the worker has registered, and return its id."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.log()}")
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                row = conn.execute("SELECT id FROM taskq.workers WHERE pid = %s", (self.pid,)).fetchone()
            if row:
                return str(row[0])
            time.sleep(0.05)
        raise AssertionError(f"worker {self.pid} did not register:\n{self.log()}")

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def spawn_worker(dsn: str, tmp_path: Path) -> Iterator[Any]:
    procs: list[WorkerProcess] = []

    def spawn(app: str = "taskq_testapp:actors", **settings: Any) -> WorkerProcess:
        merged = PROCESS_WINDOWS | settings
        args = [sys.executable, "-m", "taskq.worker", app]
        for name, value in merged.items():
            rendered = ",".join(value) if isinstance(value, list) else str(value)
            args += ["--" + name.replace("_", "-"), rendered]
        env = os.environ | {"TASKQ_DSN": dsn, "PYTHONPATH": APPS}
        log_path = tmp_path / f"worker-{len(procs)}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        wp = WorkerProcess(proc, log_path, dsn)
        procs.append(wp)
        return wp

    yield spawn
    for wp in procs:
        if wp.proc.poll() is None:
            os.kill(wp.pid, signal.SIGCONT)
            wp.proc.kill()
            wp.proc.wait(10)
