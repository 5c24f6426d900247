"""Retention by terminal class: each class on its own window, jobs deleted with their events, attempts
rows on theirs; never a non-terminal row; many pruners at once; the worker's pruner; `taskq prune`."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import Backend
from taskq.models import PruneClass
from taskq.ops.retention import prune

pytestmark = pytest.mark.timeout(120)

TERMINAL = ("succeeded", "cancelled", "failed", "crashed", "abandoned")

SEED_SQL = """
WITH ins AS (
    INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, finished_at, created_at, cancel_requested_at,
                            worker_id, lock_expires_at)
    SELECT 'seed', %(status)s::text, 1, 1,
           CASE WHEN %(finished)s THEN now() - %(age)s * interval '1 second' END,
           now() - %(age)s * interval '1 second' - interval '1 minute',
           CASE WHEN %(status)s = 'cancelled' THEN now() - %(age)s * interval '1 second' END,
           CASE WHEN %(status)s = 'running' THEN 'w' END,
           CASE WHEN %(status)s = 'running' THEN now() + interval '1 hour' END
    FROM generate_series(1, %(n)s)
    RETURNING id
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt)
    SELECT id, 'state_change', 'running', %(status)s, 1 FROM ins
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at, finished_at, outcome)
    SELECT id, 1, 1, 'w', now() - %(age)s * interval '1 second' - interval '1 minute',
           CASE WHEN %(finished)s THEN now() - %(age)s * interval '1 second' END,
           CASE WHEN %(finished)s THEN 'failed' END
    FROM ins
)
SELECT id FROM ins
"""


def seed(dsn: str, status: str, age: float, n: int = 1, *, finished: bool | None = None) -> list[uuid.UUID]:
    """`n` jobs in `status` that finished `age` seconds ago (a non-terminal row may carry a stale
    finished_at too: the prune must ignore it), each with one event and one attempts row."""
    done = status in TERMINAL if finished is None else finished
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(SEED_SQL, {"status": status, "age": age, "n": n, "finished": done}).fetchall()
    return [r[0] for r in rows]


def remaining(dsn: str, ids: list[uuid.UUID]) -> tuple[int, int, int]:
    (row,) = query(
        dsn,
        "SELECT (SELECT count(*) FROM taskq.jobs WHERE id = ANY(%s)),"
        " (SELECT count(*) FROM taskq.job_events WHERE job_id = ANY(%s)),"
        " (SELECT count(*) FROM taskq.job_attempts WHERE job_id = ANY(%s))",
        ids, ids, ids,
    )
    return int(row[0]), int(row[1]), int(row[2])


def windows(succeeded: float = 0, failed: float = 0, attempts: float = 0) -> dict[PruneClass, float]:
    return {PruneClass.SUCCEEDED: succeeded, PruneClass.FAILED: failed, PruneClass.ATTEMPTS: attempts}


async def test_each_class_is_pruned_after_its_own_window_with_its_events(dsn: str) -> None:
    hour = 3600.0
    old_ok = seed(dsn, "succeeded", 2 * hour) + seed(dsn, "cancelled", 2 * hour)
    young_ok = seed(dsn, "succeeded", 0.5 * hour) + seed(dsn, "cancelled", 0.5 * hour)
    # 2 h old failures are inside their 3 h window; 4 h old ones are past it
    kept_bad = seed(dsn, "failed", 2 * hour) + seed(dsn, "crashed", 2 * hour) + seed(dsn, "abandoned", 2 * hour)
    old_bad = seed(dsn, "failed", 4 * hour) + seed(dsn, "crashed", 4 * hour) + seed(dsn, "abandoned", 4 * hour)
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, windows(succeeded=hour, failed=3 * hour, attempts=100 * hour))
    finally:
        await backend.close()
    assert (result.succeeded, result.failed, result.attempts, result.events) == (2, 3, 0, 5)
    assert remaining(dsn, old_ok) == (0, 0, 2)  # the attempts rows outlive their jobs
    assert remaining(dsn, old_bad) == (0, 0, 3)
    assert remaining(dsn, young_ok) == (2, 2, 2)
    assert remaining(dsn, kept_bad) == (3, 3, 3)


async def test_attempts_rows_go_on_their_own_window_and_open_attempts_never(dsn: str) -> None:
    hour = 3600.0
    old = seed(dsn, "succeeded", 10 * hour)
    young = seed(dsn, "succeeded", 2 * hour)
    running = seed(dsn, "running", 10 * hour, finished=False)  # open attempt, started 10 h ago
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, windows(attempts=5 * hour))
    finally:
        await backend.close()
    assert (result.succeeded, result.failed, result.attempts) == (0, 0, 1)
    assert remaining(dsn, old) == (1, 1, 0)
    assert remaining(dsn, young) == (1, 1, 1)
    assert remaining(dsn, running) == (1, 1, 1)


async def test_a_window_of_zero_keeps_its_class_forever(dsn: str) -> None:
    ancient = 10 * 365 * 86400.0
    ids = [i for status in TERMINAL for i in seed(dsn, status, ancient)]
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, windows())
        only_failed = await prune(backend, windows(failed=1.0))
    finally:
        await backend.close()
    assert result.total == 0 and result.batches == 0
    assert (only_failed.succeeded, only_failed.failed, only_failed.attempts) == (0, 3, 0)
    assert remaining(dsn, ids) == (2, 2, 5)


async def test_non_terminal_rows_are_never_pruned(dsn: str) -> None:
    ancient = 10 * 365 * 86400.0
    # a stale finished_at on a row that is not terminal (as after a retry) must not make it prunable
    live = [i for status in ("pending", "scheduled", "running") for i in seed(dsn, status, ancient, finished=True)]
    query(dsn, "UPDATE taskq.job_attempts SET finished_at = NULL WHERE job_id = ANY(%s)", live)
    backend = await Backend.open(dsn, max_size=1)
    try:
        dry = await prune(backend, windows(0.001, 0.001, 0.001), dry_run=True)
        result = await prune(backend, windows(0.001, 0.001, 0.001))
    finally:
        await backend.close()
    assert dry.total == 0 and result.total == 0
    assert remaining(dsn, live) == (3, 3, 3)


async def test_two_pruners_at_once_share_the_rows_and_delete_each_once(dsn: str) -> None:
    ids = seed(dsn, "succeeded", 7200.0, n=6000)
    kept = seed(dsn, "succeeded", 60.0, n=50)
    backends = [await Backend.open(dsn, max_size=1) for _ in range(2)]
    try:
        results = await asyncio.gather(
            *(prune(b, windows(succeeded=3600.0), batch_size=200, pause_ratio=0.0) for b in backends)
        )
    finally:
        for b in backends:
            await b.close()
    assert sum(r.succeeded for r in results) == 6000
    assert sum(r.events for r in results) == 6000
    assert remaining(dsn, ids) == (0, 0, 6000)
    assert remaining(dsn, kept) == (50, 50, 50)


async def test_one_pruner_at_a_time_across_the_fleet(dsn: str) -> None:
    """Another pruner holding the gate (in a batch or in its pause) ends this one's round at once."""
    ids = seed(dsn, "succeeded", 7200.0, n=10)
    backend = await Backend.open(dsn, max_size=1)
    try:
        async with await psycopg.AsyncConnection.connect(dsn) as other:
            await other.execute("SELECT pg_advisory_xact_lock(7461732, 1)")  # held until its rollback
            blocked = await prune(backend, windows(succeeded=3600.0))
            await other.rollback()
        result = await prune(backend, windows(succeeded=3600.0))
    finally:
        await backend.close()
    assert blocked.total == 0 and blocked.batches == 1
    assert result.succeeded == 10 and remaining(dsn, ids) == (0, 0, 10)


async def test_the_worker_prunes_finished_jobs_periodically(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="ret.ok", registry=reg)
    async def ok(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="ret.bad", registry=reg, max_attempts=1)
    async def bad(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("no")

    waiting = await client.enqueue("ret.elsewhere", 1, queue="nobody-reads-this")
    async with running_worker(dsn, reg, prune_interval=0.2, retention_succeeded=0.5, retention_failed=3600.0,
                              retention_attempts=0.0):
        good = [await client.enqueue(ok, i) for i in range(5)]
        failing = await client.enqueue(bad, 1)
        ids = [h.job_id for h in good]
        await wait_for(lambda: remaining(dsn, ids)[0] == 0, timeout=20)
        assert (await client.get(failing.job_id)) is not None
    assert remaining(dsn, ids) == (0, 0, 5)  # retention_attempts=0 keeps every attempts row
    assert remaining(dsn, [failing.job_id]) == (1, 2, 1)
    assert remaining(dsn, [waiting.job_id])[0] == 1


def explain(dsn: str, name: str, params: dict[str, Any]) -> str:
    from taskq import sql

    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN " + sql.query(name), params).fetchall()
    return "\n".join(r[0] for r in rows)


def test_prune_batches_read_the_retention_indexes(dsn: str) -> None:
    for status in ("pending", "succeeded", "failed"):
        seed(dsn, status, 7200.0, n=3000)
    query(dsn, "ANALYZE taskq.jobs")
    query(dsn, "ANALYZE taskq.job_attempts")
    params = {"keep": 3600.0, "limit": 1000}
    assert "jobs_retention_succeeded_idx" in explain(dsn, "prune_succeeded", params)
    assert "jobs_retention_failed_idx" in explain(dsn, "prune_failed", params)
    assert "job_attempts_retention_idx" in explain(dsn, "prune_attempts", params)


# -- taskq prune ----------------------------------------------------------------------------------


def cli_env(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return env | {"TASKQ_DSN": dsn} | extra


def run_prune(dsn: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "taskq.cli", "prune", *args], env=cli_env(dsn, **extra),
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_dry_run_counts_per_class_and_deletes_nothing(dsn: str) -> None:
    ids = seed(dsn, "succeeded", 2 * 86400.0, n=3) + seed(dsn, "crashed", 8 * 86400.0, n=2)
    ids += seed(dsn, "failed", 2 * 86400.0)  # inside the 7-day default
    result = run_prune(dsn, "--dry-run", "--json")
    assert result.returncode == 0 and result.stderr == "", result
    counts = json.loads(result.stdout)
    assert (counts["succeeded"], counts["failed"], counts["events"], counts["dry_run"]) == (3, 2, 5, True)
    assert remaining(dsn, ids) == (6, 6, 6)
    text = run_prune(dsn, "--dry-run")
    assert "would delete" in text.stdout and "nothing deleted" in text.stdout


def test_cli_prune_uses_the_retention_flags_and_env(dsn: str) -> None:
    ids = seed(dsn, "succeeded", 120.0, n=2) + seed(dsn, "failed", 120.0)
    result = run_prune(dsn, "--retention-succeeded", "60", "--json", TASKQ_RETENTION_FAILED="0")
    assert result.returncode == 0, result
    assert json.loads(result.stdout)["succeeded"] == 2 and json.loads(result.stdout)["failed"] == 0
    assert remaining(dsn, ids)[0] == 1
    text = run_prune(dsn, TASKQ_RETENTION_FAILED="60")
    assert text.returncode == 0 and text.stderr == ""  # piped: no progress line
    assert "failed+crashed+abandoned jobs    1" in text.stdout


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "soon"])
def test_cli_refuses_a_bad_window_in_one_line_and_deletes_nothing(dsn: str, value: str) -> None:
    ids = seed(dsn, "succeeded", 10 * 86400.0)
    result = run_prune(dsn, f"--retention-succeeded={value}")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskq: error: ") and "retention_succeeded" in lines[0]
    assert remaining(dsn, ids) == (1, 1, 1)


def test_cli_prune_shows_progress_on_a_terminal(dsn: str) -> None:
    seed(dsn, "succeeded", 2 * 86400.0, n=2500)
    leader, follower = pty.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "taskq.cli", "prune"], env=cli_env(dsn),
                                stdout=subprocess.PIPE, stderr=follower, text=True)
        os.close(follower)
        out, _ = proc.communicate(timeout=60)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert proc.returncode == 0
    assert b"pruned 2,500 rows" in seen and b"rows/s" in seen
    assert "succeeded+cancelled jobs         2500" in out
