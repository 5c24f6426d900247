"""`taskq bench` run as a real command against a real database, with small figures: it prints every figure,
as a table and as JSON, and leaves the database exactly as it found it (every table of the taskq schema, row
for row), with a job of another queue untouched, also when SIGTERM stops it in the middle of the drain. On a
database never migrated, or as a role that may not delete what a run writes, it writes nothing at all."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from testkit import query, wait_until

from taskq.client import JobsClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

METRICS = ["enqueue", "enqueue_many", "drain", "pickup p50", "pickup p99"]
SMALL = ("--jobs", "300", "--seconds", "0.5")
TABLE_DIGEST = "SELECT count(*), md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM taskq.{table} AS t"
DRAINING = (
    "SELECT w.pid FROM taskq.workers AS w WHERE w.id LIKE 'taskq-bench-%%' AND EXISTS ("
    "SELECT 1 FROM taskq.jobs AS j WHERE j.status = 'succeeded' AND j.queue LIKE 'taskq-bench-%%')"
)


def bench_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "taskq.cli", "bench", *args]


def bench_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return env | {"TASKQ_DSN": dsn}


def run_bench(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        bench_command(*SMALL, *args), env=bench_env(dsn), capture_output=True, text=True, timeout=90, check=False
    )
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result


def every_table(dsn: str) -> dict[str, tuple[int, str]]:
    """Each table of the taskq schema: its row count and a checksum of its rows."""
    tables = [
        name
        for (name,) in query(
            dsn,
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = 'taskq' AND table_type = 'BASE TABLE'",
        )
    ]
    found = {}
    for name in sorted(tables):
        ((count, digest),) = query(dsn, TABLE_DIGEST.format(table=name))
        found[name] = (int(count), str(digest))
    return found


def seed_other_queue(dsn: str) -> str:
    """A pending job of another queue (no worker serves it), enqueued before the bench."""

    async def go() -> str:
        async with await JobsClient.connect(dsn) as client:
            handle = await client.enqueue("shop.invoice", {"order": 42}, queue="invoices", tags=("tenant-a",))
        return str(handle.job_id)

    return asyncio.run(go())


def job_row(dsn: str, job_id: str) -> tuple[Any, ...]:
    (row,) = query(dsn, "SELECT j::text FROM taskq.jobs AS j WHERE id = %s", job_id)
    return row


def test_bench_prints_every_figure_and_leaves_every_table_as_it_found_it(dsn: str) -> None:
    other = seed_other_queue(dsn)
    before, other_row = every_table(dsn), job_row(dsn, other)

    result = run_bench(dsn)

    assert (result.returncode, result.stderr) == (0, ""), result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("taskq bench: ") and "CPUs, PostgreSQL " in lines[0] and "synchronous_commit" in lines[0]
    assert lines[1].split() == ["metric", "value", "unit"]
    figures = {}
    for line in lines[2 : 2 + len(METRICS)]:
        *name, value, unit = line.split()
        figures[" ".join(name)] = (float(value.replace(",", "")), unit)
    assert list(figures) == METRICS
    assert all(value > 0 for value, _ in figures.values()), figures
    assert [unit for _, unit in figures.values()] == ["jobs/s", "jobs/s", "jobs/s", "ms", "ms"]
    assert "drain: 300 no-op jobs" in result.stdout and "cleaned up queue taskq-bench-" in result.stdout

    assert every_table(dsn) == before
    assert job_row(dsn, other) == other_row
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE queue LIKE 'taskq-bench-%%'") == [(0,)]


def test_bench_json_has_every_field_and_the_queue_it_wrote_is_gone(dsn: str) -> None:
    other = seed_other_queue(dsn)
    before = every_table(dsn)

    result = run_bench(dsn, "--json", "--workers", "2")

    assert (result.returncode, result.stderr) == (0, ""), result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {
        "database",
        "queue",
        "machine",
        "plan",
        "metrics",
        "drained",
        "pickup_jobs",
        "deleted",
        "elapsed",
    }
    assert report["queue"].startswith("taskq-bench-") and len(report["queue"]) == len("taskq-bench-") + 8
    assert report["machine"]["cpus"] >= 1 and report["machine"]["postgresql"]
    assert report["machine"]["synchronous_commit"] in ("on", "off", "local", "remote_write", "remote_apply")
    assert report["plan"] == {"jobs": 300, "workers": 2, "seconds": 0.5, "batch": 100, "pickup_rate": 50.0}
    assert [m["metric"] for m in report["metrics"]] == METRICS
    assert all(m["value"] > 0 for m in report["metrics"]), report["metrics"]
    assert [m["unit"] for m in report["metrics"]] == ["jobs/s", "jobs/s", "jobs/s", "ms", "ms"]
    assert report["drained"] == 300 and report["pickup_jobs"] == 25
    deleted = report["deleted"]
    assert set(deleted) == {"jobs", "events", "attempts", "workers", "other"}
    assert deleted["jobs"] > 300 + 25 and deleted["attempts"] == 300 + 25 and deleted["events"] > 0
    assert report["elapsed"] > 0

    assert every_table(dsn) == before
    assert query(dsn, "SELECT queue, status FROM taskq.jobs") == [("invoices", "pending")]
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE id = %s", other) == [(1,)]


def test_sigterm_in_the_middle_of_the_drain_stops_the_workers_and_deletes_every_row(dsn: str) -> None:
    seed_other_queue(dsn)
    before = every_table(dsn)
    proc = subprocess.Popen(
        bench_command("--jobs", "100000", "--seconds", "0.5"),
        env=bench_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # the drain is under way: the bench's worker has registered and taken jobs
        (worker_pid,) = wait_until(lambda: query(dsn, DRAINING), timeout=60)[0]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert (proc.returncode, out, err) == (130, "", "taskq: error: interrupted\n")
    with pytest.raises(ProcessLookupError):
        os.kill(worker_pid, 0)  # stopped and reaped by the bench before it exited
    assert every_table(dsn) == before


def test_bench_on_a_database_never_migrated_exits_5_and_creates_nothing(empty_dsn: str) -> None:
    tables = query(empty_dsn, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'taskq'")
    result = run_bench(empty_dsn)
    assert result.returncode == 5 and result.stdout == ""
    assert result.stderr.startswith("taskq: error: ") and "taskq migrate" in result.stderr
    assert query(empty_dsn, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'taskq'") == tables


def test_a_role_that_may_not_delete_is_refused_before_anything_is_written(admin_dsn: str, dsn: str) -> None:
    role = f"taskq_bench_reader_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(role)))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                pgsql.SQL(
                    "GRANT USAGE ON SCHEMA taskq TO {0}; GRANT SELECT, INSERT ON ALL TABLES IN SCHEMA taskq TO {0}"
                ).format(pgsql.Identifier(role))
            )
        before = every_table(dsn)
        result = run_bench(make_conninfo(dsn, user=role))
        assert (result.returncode, result.stdout) == (2, "")
        assert result.stderr.startswith(
            "taskq: error: taskq bench deletes the rows it writes, and this role may not delete from taskq.jobs, "
        )
        assert "nothing was written" in result.stderr and len(result.stderr.splitlines()) == 1
        assert every_table(dsn) == before
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP OWNED BY {}").format(pgsql.Identifier(role)))
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
