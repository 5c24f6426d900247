"""A token confined to one queue cannot start code bound to another, end to end with real processes.

The app declares `billing.refund_all` (queue billing, writes a file when it runs) and `sandbox.echo`
(queue sandbox). A token holds `jobs:*@sandbox`. A `taskq web --app` process refuses
to enqueue billing.refund_all into sandbox (400). A `taskq web` that does not know the app accepts the job
by name; a real `taskq worker APP --queues sandbox` then fails it as ActorQueueMismatch, and the file the
actor would write never appears. An unknown actor's failure does not list the worker's actors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from testkit import _free_port, query, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

APP = '''
import os
from pathlib import Path
from typing import Any

from taskq import actor

MARKERS = Path(os.environ["H1_MARKERS"])


@actor(name="billing.refund_all", queue="billing")
def refund_all(payload: Any) -> str:
    (MARKERS / "REFUND_ALL_RAN").write_text("billing.refund_all ran")
    return "refunded everyone"


@actor(name="sandbox.echo", queue="sandbox")
def echo(payload: Any) -> Any:
    (MARKERS / "ECHO_RAN").write_text("sandbox.echo ran")
    return payload


actors = [refund_all, echo]
'''

WORKER_WINDOWS = ["--heartbeat-interval", "0.2", "--lock-timeout", "1.0", "--poll-interval", "0.2",
                  "--sweep-interval", "0.3"]


class Processes:
    def __init__(self, dsn: str, tmp: Path) -> None:
        self.dsn = dsn
        self.tmp = tmp
        self.markers = tmp / "markers"
        self.markers.mkdir()
        (tmp / "h1app.py").write_text(textwrap.dedent(APP))
        self.env = os.environ | {"TASKQ_DSN": dsn, "PYTHONPATH": str(tmp), "H1_MARKERS": str(self.markers)}
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "wb") as out:
            proc = subprocess.Popen([sys.executable, *args], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.tmp)
        self.procs.append((proc, log_path))
        return proc

    def web(self, name: str, *, knows_app: bool) -> str:
        """A real `taskq web` process; `knows_app`: started with `--app` (the web checks enqueues against its
        actors)."""
        port = _free_port()
        cli = ["web", "--port", str(port)]
        if knows_app:
            proc = self.start(name, ["-m", "taskq.cli", *cli, "--app", "h1app:actors"])
        else:
            proc = self.start(name, ["-m", "taskq.cli", *cli])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: self._answers(proc, url, name), timeout=60)
        return url

    def _answers(self, proc: subprocess.Popen[bytes], url: str, name: str) -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{name} exited with {proc.returncode}: {self.log(name)}")
        try:
            return httpx.get(f"{url}/login", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@pytest.fixture
def processes(dsn: str, tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(dsn, tmp_path)
    try:
        yield procs
    finally:
        procs.stop()


def sandbox_token(dsn: str) -> str:
    made = subprocess.run([sys.executable, "-m", "taskq.cli", "--dsn", dsn, "tokens", "create", "sandbox",
                           "--grant", "jobs:*@sandbox"], capture_output=True, text=True, timeout=60, check=False)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def post_job(url: str, token: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/jobs", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def job_row(dsn: str, job_id: str) -> dict[str, Any] | None:
    rows = query(dsn, "SELECT status, error_class, error_message, attempt FROM taskq.jobs WHERE id = %s", job_id)
    if not rows:
        return None
    status, error_class, error_message, attempt = rows[0]
    return {"status": status, "error_class": error_class, "error_message": error_message, "attempt": attempt}


def terminal(dsn: str, job_id: str) -> dict[str, Any] | None:
    row = job_row(dsn, job_id)
    return row if row is not None and row["status"] in ("succeeded", "failed", "cancelled", "crashed") else None


def test_a_web_that_knows_the_app_refuses_another_queues_actor_with_400(dsn: str, processes: Processes) -> None:
    token = sandbox_token(dsn)
    url = processes.web("web-app", knows_app=True)
    refused = post_job(url, token, {"actor": "billing.refund_all", "queue": "sandbox", "payload": {}})
    assert refused.status_code == 400, refused.text
    problem = refused.json()
    assert problem["code"] == "INVALID_ARGUMENT"
    assert "billing.refund_all" in problem["detail"] and "'sandbox'" in problem["detail"], problem
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 0
    # the actor bound to the token's queue is accepted
    ok = post_job(url, token, {"actor": "sandbox.echo", "queue": "sandbox", "payload": {"x": 1}})
    assert ok.status_code == 201, ok.text


def test_a_worker_never_runs_another_queues_actor_a_sandbox_token_enqueued_by_name(
    dsn: str, processes: Processes
) -> None:
    token = sandbox_token(dsn)
    url = processes.web("web-plain", knows_app=False)  # a producer without the app's code
    smuggled = post_job(url, token, {"actor": "billing.refund_all", "queue": "sandbox", "payload": {},
                                     "max_attempts": 3})
    assert smuggled.status_code == 201, smuggled.text
    unknown = post_job(url, token, {"actor": "no.such.actor", "queue": "sandbox", "payload": {}})
    echo = post_job(url, token, {"actor": "sandbox.echo", "queue": "sandbox", "payload": {"x": 1}})
    assert unknown.status_code == 201 and echo.status_code == 201
    smuggled_id, unknown_id, echo_id = (r.json()["job"]["id"] for r in (smuggled, unknown, echo))

    worker = processes.start("worker", ["-m", "taskq.cli", "worker", "h1app:actors", "--queues", "sandbox",
                                        *WORKER_WINDOWS])
    for job_id in (smuggled_id, unknown_id, echo_id):
        wait_until(lambda job_id=job_id: terminal(dsn, job_id), timeout=60)
    assert worker.poll() is None, processes.log("worker")

    row = terminal(dsn, smuggled_id)
    assert row is not None and (row["status"], row["error_class"], row["attempt"]) == (
        "failed", "ActorQueueMismatch", 1), row
    assert "'sandbox'" in row["error_message"] and "['billing']" in row["error_message"], row
    assert not (processes.markers / "REFUND_ALL_RAN").exists(), "the billing actor ran on a sandbox job"
    assert (processes.markers / "ECHO_RAN").exists()  # the worker does run the sandbox's own work
    assert terminal(dsn, echo_id) == {"status": "succeeded", "error_class": None, "error_message": None,
                                      "attempt": 1}

    # an unknown actor's failure, as the token reads it back, names no actor of the worker's
    seen = httpx.get(f"{url}/api/v1/jobs/{unknown_id}", headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert seen.status_code == 200, seen.text
    job = seen.json()["job"]
    assert job["status"] == "failed" and job["error_class"] == "UnknownActor", job
    assert "billing.refund_all" not in job["error_message"] and "sandbox.echo" not in job["error_message"], job
    # the worker's operator still learns what it knows, from its log
    wait_until(lambda: "no.such.actor" in processes.log("worker"), timeout=30)
    assert "billing.refund_all" in processes.log("worker")
