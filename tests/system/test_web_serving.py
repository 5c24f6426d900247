"""`taskq run APP --web-port PORT` serves the dashboard and the API from the supervisor's host, beside its
workers, and stops it with them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from testkit import _free_port, query, wait_until

APPS = str(Path(__file__).resolve().parents[1] / "apps")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_supervisor_serves_the_web_app_and_stops_it_with_the_workers(dsn: str, tmp_path: Path) -> None:
    port = _free_port()
    env = os.environ | {"TASKQ_DSN": dsn, "PYTHONPATH": APPS}
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "taskq.cli", "run", "taskq_testapp:actors", "--workers", "1",
                                 "--metrics-port", "0", "--web-port", str(port)], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.workers")[0][0] == 1, timeout=60)
        wait_until(lambda: _listening(port), timeout=60)
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", timeout=30)
        assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"  # auth is on
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/openapi.json", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log_path.read_text(errors="replace")
    wait_until(lambda: not _listening(port), timeout=30)
