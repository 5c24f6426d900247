"""`taskq enqueue --unique-key`, `taskq requeue`, and what `taskq job` / `taskq jobs` show of them,
run as real subprocesses against a real PostgreSQL."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys

import pytest
from test_cli import ok, run_cli, user_error
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobsClient
from taskq.actors.declaration import ActorRegistry, actor

pytestmark = pytest.mark.timeout(120)


def test_enqueue_with_a_unique_key_prints_the_holder_and_writes_nothing_the_second_time(dsn: str) -> None:
    first = ok(run_cli("enqueue", "a.b", "--payload", "1", "--unique-key", "order-7", dsn=dsn)).strip()
    again = run_cli("enqueue", "a.b", "--payload", "2", "--unique-key", "order-7", dsn=dsn)
    assert again.returncode == 0 and again.stdout.strip() == first
    assert again.stderr.startswith("taskq: note: unique key held by this existing job (pending)")
    as_json = json.loads(ok(run_cli("enqueue", "a.b", "--payload", "3", "--unique-key", "order-7", "--json",
                                    dsn=dsn)))
    assert as_json["id"] == first and as_json["created"] is False and as_json["unique_key"] == "order-7"
    kept = json.loads(ok(run_cli("enqueue", "a.b", "--payload", "4", "--unique-key", "other",
                                 "--unique-scope", "retained", "--json", dsn=dsn)))
    assert kept["created"] is True and kept["unique_scope"] == "retained"
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--unique-key", ""), "unique_key must be 1-255 characters"),
        (("--unique-key", "k" * 256), "unique_key must be 1-255 characters"),
        (("--unique-key", "k", "--unique-scope", "forever"), "invalid choice: 'forever'"),
        (("--unique-scope", "retained"), "needs a unique_key"),
    ],
)
def test_a_bad_unique_key_or_scope_is_a_usage_error(dsn: str, args: tuple[str, ...], fragment: str) -> None:
    line = user_error(run_cli("enqueue", "a.b", "--payload", "{}", *args, dsn=dsn), 2)
    assert fragment in line
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 0


async def failed_jobs(dsn: str, n: int, *, tags: tuple[str, ...] = (), unique_key: str | None = None) -> list[str]:
    """`n` jobs that a real (in-process) worker ran and failed."""
    reg = ActorRegistry()

    @actor(name="cli.fails", registry=reg, max_attempts=1)
    async def fails(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("broken")

    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg):
        handles = [await client.enqueue(fails, i, tags=tags, unique_key=unique_key) for i in range(n)]

        async def all_failed() -> bool:
            return all([(await h.refresh()).status == "failed" for h in handles])

        await wait_for(all_failed, timeout=30)
    return [str(h.job_id) for h in handles]


async def test_requeue_one_job_prints_one_line_and_json_and_job_shows_the_requeues(dsn: str) -> None:
    (job_id,) = await failed_jobs(dsn, 1, unique_key="cli-key")
    out = ok(run_cli("requeue", job_id, "--reason", "fixed", "--attempts", "2", dsn=dsn))
    assert out.splitlines() == [f"job {job_id}: failed -> pending, requeued=true: back in the queue, due now"]
    again = json.loads(ok(run_cli("requeue", job_id, "--json", dsn=dsn)))
    assert again == {"job_id": job_id, "previous_status": "pending", "new_status": "pending", "requeued": False,
                     "conflict_job_id": None, "revived": []}
    detail = ok(run_cli("job", job_id, dsn=dsn))
    assert "unique key   cli-key (scope active)" in detail and "requeues     1" in detail
    assert "requeued" in detail and '"reason": "fixed"' in detail
    listing = ok(run_cli("jobs", dsn=dsn)).splitlines()
    assert listing[0].split() == ["id", "actor", "queue", "status", "attempt", "requeues", "created", "(UTC)",
                                  "unique_key", "error_class"]
    assert listing[1].split()[3:6] == ["pending", "1/3", "1"] and "cli-key" in listing[1]
    assert query(dsn, "SELECT max_attempts FROM taskq.jobs")[0][0] == 3


async def test_requeue_by_tag_counts_by_previous_status_and_stays_quiet_when_piped(dsn: str) -> None:
    tagged = await failed_jobs(dsn, 3, tags=("tenant-a",))
    other = await failed_jobs(dsn, 1, tags=("tenant-b",))
    result = run_cli("requeue", "--tag", "tenant-a", "--reason", "bulk", dsn=dsn)
    assert result.returncode == 0 and result.stderr == ""  # no progress line: stderr is not a terminal
    assert "failed           3" in result.stdout and "total            3" in result.stdout
    as_json = json.loads(ok(run_cli("requeue", "--tag", "tenant-b", "--json", dsn=dsn)))
    assert as_json["job_ids"] == other and as_json["by_previous_status"] == {"failed": 1}
    assert as_json["conflicts"] == {} and as_json["batches"] == 1
    rows = dict(query(dsn, "SELECT id::text, status FROM taskq.jobs"))
    assert {rows[i] for i in tagged + other} == {"pending"}
    assert "nothing requeued" in ok(run_cli("requeue", "--tag", "tenant-a", dsn=dsn))


def test_requeue_errors_are_one_line_with_their_exit_codes(dsn: str) -> None:
    assert "no job with id" in user_error(run_cli("requeue", "01a229fc-578a-725e-ba5e-940677b81b70", dsn=dsn), 4)
    assert "not a job id" in user_error(run_cli("requeue", "not-a-uuid", dsn=dsn), 2)
    assert "not both" in user_error(
        run_cli("requeue", "01a229fc-578a-725e-ba5e-940677b81b70", "--tag", "t", dsn=dsn), 2)
    assert "give a job ID" in user_error(run_cli("requeue", dsn=dsn), 2)
    assert "--attempts" in user_error(run_cli("requeue", "--tag", "t", "--attempts", "0", dsn=dsn), 2)


def run_with_stderr_on_a_terminal(dsn: str, *args: str) -> tuple[int, bytes, bytes]:
    """`taskq ARGS` with stdout piped and stderr on a pseudo-terminal: (exit code, stdout, terminal)."""
    primary, secondary = pty.openpty()
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"TASKQ_DSN": dsn}
        done = subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, stdout=subprocess.PIPE,
                              stderr=secondary, timeout=60, check=False)
        os.close(secondary)
        secondary = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # EIO: the other end is closed and everything was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    return done.returncode, done.stdout, drawn


async def test_bulk_requeue_draws_a_progress_line_on_a_terminal_only(dsn: str) -> None:
    await failed_jobs(dsn, 3, tags=("tty",))
    code, stdout, drawn = run_with_stderr_on_a_terminal(dsn, "requeue", "--tag", "tty")
    assert code == 0
    assert b"requeue: 3 rows so far" in drawn and b"rows/s" in drawn
    assert b"total" in stdout and b"rows so far" not in stdout
    await failed_jobs(dsn, 1, tags=("tty-json",))
    code, stdout, drawn = run_with_stderr_on_a_terminal(dsn, "requeue", "--tag", "tty-json", "--json")
    assert code == 0 and drawn == b"" and json.loads(stdout)["by_previous_status"] == {"failed": 1}
