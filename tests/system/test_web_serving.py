"""`taskq run APP --web-port PORT` serves the dashboard and the API from the supervisor's host, beside its
workers, restarts it (with backoff, logged) when it dies, and stops it with them."""

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


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _web_child(pid: int) -> int | None:
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].startswith(b"taskq web"):  # it retitles itself (no --dsn may stay in ps)
            return child
    return None


def _answers(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/login", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_killed_web_child_is_restarted_and_the_dashboard_answers_again(dsn: str, tmp_path: Path) -> None:
    port = _free_port()
    env = os.environ | {"TASKQ_DSN": dsn, "PYTHONPATH": APPS}
    log_path = tmp_path / "run.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "taskq.cli", "run", "taskq_testapp:actors", "--workers", "1",
                                 "--metrics-port", "0", "--web-port", str(port), "--restart-backoff", "0.2"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(port), timeout=60)
        wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.workers")[0][0] == 1, timeout=60)
        (worker_id,) = query(dsn, "SELECT id FROM taskq.workers")[0]
        for _round in range(2):  # twice: the restarted child is watched like the first
            first = _web_child(proc.pid)
            assert first is not None, log_path.read_text(errors="replace")
            os.kill(first, signal.SIGKILL)
            wait_until(lambda old=first: _web_child(proc.pid) not in (None, old), timeout=60)  # a new child
            wait_until(lambda: _answers(port), timeout=60)  # which serves the dashboard
        assert proc.poll() is None
        # the workers were not touched: the same worker, still registered
        assert query(dsn, "SELECT id FROM taskq.workers") == [(worker_id,)]
        text = log_path.read_text(errors="replace")
        assert text.count("was killed by SIGKILL; restarting it in") == 2, text
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    assert code == 0, log_path.read_text(errors="replace")
    wait_until(lambda: not _listening(port), timeout=30)
