"""A real `taskq web` process: a `--dsn` typed on its command line leaves `ps` at once, `--dsn-file`
serves, every request writes one access line (the principal's name, never the token; 401s at WARNING),
and `--allowed-host` adds a Host name while any other is refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from psycopg.conninfo import make_conninfo
from testkit import _free_port, wait_until

from taskq.backend import Backend
from taskq.ops.tokens import create_token

pytestmark = pytest.mark.slow

PASSWORD = "Web-Hardening-S3cret"
"""In the DSN given on the command line (the test server's trust authentication ignores it)."""


@contextmanager
def taskq_web(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> Iterator[tuple[int, int]]:
    """(pid, port) of a `taskq web` serving until the block ends (then stopped by SIGTERM, its own pid)."""
    port = _free_port()
    full_env = {k: v for k, v in os.environ.items() if k != "TASKQ_DSN"} | (env or {})
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "taskq.cli", "web", "--port", str(port), *args],
                                env=full_env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _answers(proc, port, log_path), timeout=30)
        yield proc.pid, port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _answers(proc: subprocess.Popen[bytes], port: int, log_path: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"taskq web exited with {proc.returncode}: {log_path.read_text(errors='replace')}")
    try:
        return httpx.get(f"http://127.0.0.1:{port}/login", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


async def _token(dsn: str, name: str) -> str:
    backend = await Backend.open(dsn)
    try:
        return (await create_token(backend, name, ["*@*"]))[1]
    finally:
        await backend.close()


def test_a_dsn_on_the_command_line_leaves_ps_and_each_request_writes_one_access_line(
        dsn: str, tmp_path: Path) -> None:
    token = asyncio.run(_token(dsn, "hardening"))
    secret_dsn = make_conninfo(dsn, password=PASSWORD)
    log_path = tmp_path / "web.log"
    with taskq_web(["--dsn", secret_dsn, "--allowed-host", "ops.example.com", "--log-format", "json"],
                   log_path) as (pid, port):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in cmdline and b"--dsn" not in cmdline, cmdline
        assert cmdline.startswith(b"taskq web"), cmdline
        base = f"http://127.0.0.1:{port}"
        ok = httpx.get(f"{base}/api/v1/jobs", headers={"Authorization": f"Bearer {token}", "X-Request-Id": "hard-1"})
        assert ok.status_code == 200
        assert httpx.get(f"{base}/api/v1/jobs", headers={"Authorization": "Bearer tq_guess"}).status_code == 401
        assert httpx.post(f"{base}/login", data={"token": "tq_guess"}).status_code == 401
        allowed = httpx.get(f"{base}/api/v1/jobs", headers={"Host": f"ops.example.com:{port}",
                                                            "Authorization": f"Bearer {token}"})
        assert allowed.status_code == 200
        refused = httpx.get(f"{base}/api/v1/jobs", headers={"Host": "rebound.example",
                                                            "Authorization": f"Bearer {token}"})
        assert refused.status_code == 400 and "--allowed-host rebound.example" in refused.json()["detail"]

        def access() -> list[dict[str, object]]:
            lines = [json.loads(line) for line in log_path.read_text(errors="replace").splitlines()
                     if line.startswith("{")]
            return [doc for doc in lines if doc.get("logger") == "taskq.web.access"]

        wait_until(lambda: len(access()) >= 6, timeout=15)  # the readiness probe's GET /login, then ours
    text = log_path.read_text(errors="replace")
    assert token not in text and "tq_guess" not in text and PASSWORD not in text
    lines = access()
    mine = [d for d in lines if d["request_id"] == "hard-1"]
    assert len(mine) == 1 and mine[0]["principal"] == "hardening" and mine[0]["route"] == "/api/v1/jobs"
    assert mine[0]["status"] == 200 and mine[0]["method"] == "GET" and isinstance(mine[0]["duration_ms"], float)
    failures = [d for d in lines if d["status"] == 401]
    assert {(d["route"], d["level"], d["client"]) for d in failures} == {
        ("/api/v1/jobs", "WARNING", "127.0.0.1"), ("/login", "WARNING", "127.0.0.1")}
    assert [d["status"] for d in lines if d["route"] == "(unmatched)"] == [400]


def test_dsn_file_serves_without_the_dsn_anywhere_in_the_process(dsn: str, tmp_path: Path) -> None:
    token = asyncio.run(_token(dsn, "filed"))
    dsn_file = tmp_path / "dsn"
    dsn_file.write_text(make_conninfo(dsn, password=PASSWORD) + "\n")
    dsn_file.chmod(0o600)
    with taskq_web(["--dsn-file", str(dsn_file)], tmp_path / "web.log") as (pid, port):
        assert PASSWORD.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        assert PASSWORD.encode() not in Path(f"/proc/{pid}/environ").read_bytes()
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
        assert r.status_code == 200
