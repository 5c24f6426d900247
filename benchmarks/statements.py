"""Where a worker's PostgreSQL time goes, statement by statement, at given worker settings.

    python benchmarks/statements.py --dsn DSN [--jobs 30000] [--configs c10,default,wide]
                                    [--claim-batches 1,10,100] [--json out.json]

Needs a server with `pg_stat_statements` loaded (`shared_preload_libraries`; `track_planning = on` to see
planning time): the embedded PostgreSQL 18 ships without the contrib modules, so this runs against a
server of its own, for example the distribution's PostgreSQL started on a scratch data directory (see
benchmarks/README.md, "statements.py"). Two parts:

1. Drain (per config): a backlog of `--jobs` no-op jobs, one worker process `taskq worker APP` with the
   config's settings (c10: `--concurrency 10`; default: none; wide: `--concurrency 500
   --claim-batch-size 200`), then per statement from pg_stat_statements: calls and rows per job,
   execution and planning µs per job, buffers per call; per index of taskq.jobs: scans and entries read
   per claimed job; HOT updates; commits per job.
2. Claim at the head of a draining queue (per claim batch size, in this process through the worker's
   own store): claim + finish batches of k from a fresh backlog; at each tenth of the drain, EXPLAIN
   (ANALYZE, BUFFERS) one claim (rolled back): buffers touched and index entries read per row returned,
   and the prepared claim's generic/custom plan counts on the claiming connection.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import DSN_HELP, RESULTS_DIR, bench_database, header, machine, print_table, server_facts, write_report
from apps import NOOP, registry

from taskq import sql
from taskq.backend import Backend
from taskq.backend.workers import Finish, WorkerStore
from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
CONFIGS: dict[str, dict[str, Any]] = {
    "c10": {"concurrency": 10},
    "default": {},
    "wide": {"concurrency": 500, "claim_batch_size": 200},
}
STATEMENTS_SQL = """
SELECT regexp_replace(left(query, 400), '\\s+', ' ', 'g'), calls, rows, total_exec_time, total_plan_time, plans,
       shared_blks_hit + shared_blks_read + shared_blks_dirtied, wal_bytes
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY total_exec_time + total_plan_time DESC
"""
INDEXES_SQL = """
SELECT indexrelname, idx_scan, idx_tup_read, idx_tup_fetch FROM pg_stat_user_indexes
WHERE schemaname = 'taskq' AND relname = 'jobs' ORDER BY indexrelname
"""
TABLE_SQL = """
SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = 'taskq' AND relname = 'jobs'
"""
COMMITS_SQL = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"


def _shape(text: str) -> str:
    """A statement's text as pg_stat_statements shows it and as taskq.sql holds it, made comparable: literals
    and placeholders as `?`, whitespace collapsed, the first 160 characters."""
    text = re.sub(r"'(?:[^']|'')*'|%\(\w+\)[sb]|\$\d+|\b\d+\b", "?", text)
    return " ".join(text.split()).rstrip(";")[:160]


SHAPES = {_shape(body): name for name, body in sql.queries().items()}


def name_of(query: str) -> str:
    """The name of a taskq statement (taskq.sql), else its first 60 characters."""
    return SHAPES.get(_shape(query)) or query[:60]


async def fill(dsn: str, jobs: int) -> None:
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        for first in range(0, jobs, 5_000):
            await client.enqueue_many(NOOP, list(range(first, min(first + 5_000, jobs))))
    finally:
        await client.close()


def reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers, taskq.lease_losses")


def drain(dsn: str, config: str, jobs: int) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
        asyncio.run(fill(dsn, jobs))
        conn.execute("VACUUM ANALYZE taskq.jobs")
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")
        time.sleep(0.6)  # statistics are flushed to shared memory at most once a second or so
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (commits0,) = conn.execute(COMMITS_SQL).fetchone() or (0,)
        args = [str(Path(sys.executable).parent / "taskq"), "worker", APP]
        for key, value in CONFIGS[config].items():
            args += ["--" + key.replace("_", "-"), str(value)]
        log = RESULTS_DIR / "logs" / f"statements-{config}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            proc = subprocess.Popen(args, env=os.environ | {"TASKQ_DSN": dsn}, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parent.parent)
        polls = 0
        try:
            while (conn.execute("SELECT count(*) FROM taskq.jobs WHERE status <> 'succeeded'").fetchone()
                   or (1,))[0]:
                polls += 1
                if proc.poll() is not None:
                    raise RuntimeError(f"the worker exited; see {log}")
                time.sleep(0.2)
        finally:
            proc.terminate()
            proc.wait(30)
        time.sleep(1.2)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (commits1,) = conn.execute(COMMITS_SQL).fetchone() or (0,)
        statements = [
            {"statement": name_of(q), "calls_per_job": calls / jobs, "rows_per_call": rows / calls if calls else 0,
             "exec_us_per_job": 1000 * exec_ms / jobs, "plan_us_per_job": 1000 * plan_ms / jobs,
             "plans_per_call": plans / calls if calls else 0, "buffers_per_call": blks / calls if calls else 0,
             "wal_bytes_per_job": float(wal) / jobs}
            for q, calls, rows, exec_ms, plan_ms, plans, blks, wal in conn.execute(STATEMENTS_SQL).fetchall()
            if "pg_stat" not in q and "count(*)" not in q
        ]
        indexes = [{"index": n, "scans_per_job": s / jobs, "entries_read_per_job": r / jobs}
                   for n, s, r, _ in conn.execute(INDEXES_SQL).fetchall()]
        upd, hot = conn.execute(TABLE_SQL).fetchone() or (0, 0)
    return {"config": config, "jobs": jobs, "statements": statements[:8], "indexes": indexes,
            "updates_per_job": upd / jobs, "hot_share": hot / upd if upd else 0,
            "commits_per_job": (int(commits1) - int(commits0) - polls - 4) / jobs}


async def head_of_queue(dsn: str, jobs: int, batch: int) -> dict[str, Any]:
    """Claim and finish batches of `batch` from a fresh backlog; EXPLAIN a claim at every tenth."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        reset(conn)
    await fill(dsn, jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE taskq.jobs")
    worker_id = "statements-bench"
    backend = await Backend.open(dsn, min_size=1, max_size=1, worker_id=worker_id)
    store = WorkerStore(backend, worker_id)
    await store.register(["default"], batch, 60.0)
    samples: list[dict[str, Any]] = []
    claim_sql = sql.query("job_claim")
    done = 0
    step = max(batch, jobs // 10)
    try:
        with psycopg.connect(dsn) as explain:
            while done < jobs:
                if done % step < batch:
                    params = {"queues": ["default"], "limit": batch, "worker_id": worker_id, "lock_timeout": 60.0}
                    row = explain.execute(b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + claim_sql.encode(),
                                          params).fetchone()
                    explain.rollback()
                    assert row is not None
                    samples.append({"done": done, **summarize_plan(row[0][0], batch)})
                claimed = await store.claim(["default"], batch, 60.0)
                if not claimed:
                    break
                await store.finish_batch([Finish(job_id=j.id, attempt=j.attempt, claim_epoch=j.claim_epoch,
                                                 status="succeeded", outcome="succeeded", result_json="null")
                                          for j in claimed])
                done += len(claimed)
        async with backend.pool.connection() as c:
            cur = await c.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                  " WHERE statement LIKE '%%INSERT INTO taskq.job_attempts%%'")
            plans = await cur.fetchone()
    finally:
        await backend.close()
    return {"batch": batch, "jobs": done, "samples": samples,
            "generic_plans": plans[0] if plans else None, "custom_plans": plans[1] if plans else None}


def summarize_plan(plan: dict[str, Any], batch: int) -> dict[str, Any]:
    """Execution and planning ms, buffers of the whole claim and of its scan of jobs_claim_idx (with the
    heap pages it visits), and the rows that scan returned."""
    scan: dict[str, Any] = {}

    def walk(node: dict[str, Any]) -> None:
        if node.get("Index Name") == "jobs_claim_idx":
            scan["buffers"] = scan.get("buffers", 0) + node.get("Shared Hit Blocks", 0) + node.get(
                "Shared Read Blocks", 0)
            scan["rows"] = scan.get("rows", 0) + int(node.get("Actual Rows", 0) * node.get("Actual Loops", 1))
        for child in node.get("Plans", []):
            walk(child)

    walk(plan["Plan"])
    top = plan["Plan"]
    return {"exec_ms": plan.get("Execution Time"), "plan_ms": plan.get("Planning Time"),
            "buffers": top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0),
            "scan_buffers": scan.get("buffers", 0), "scan_rows": scan.get("rows", 0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--configs", default="c10,default,wide")
    parser.add_argument("--claim-batches", default="1,10,100")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "statements.json")
    args = parser.parse_args()
    info = machine()
    with bench_database(args.dsn, "statements") as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        server = server_facts(dsn)
        drains = [drain(dsn, c, args.jobs) for c in args.configs.split(",")]
        heads = [asyncio.run(head_of_queue(dsn, min(args.jobs, 20_000), int(b)))
                 for b in args.claim_batches.split(",")]
    for d in drains:
        print(f"\n{d['config']} ({CONFIGS[d['config']] or 'no settings'}): {d['jobs']:,} jobs, "
              f"{d['commits_per_job']:.3f} commits/job, {d['updates_per_job']:.2f} jobs-row updates/job, "
              f"{100 * d['hot_share']:.0f}% HOT")
        print_table(["statement", "calls/job", "rows/call", "exec µs/job", "plan µs/job", "plans/call",
                     "buffers/call", "WAL B/job"],
                    [[s["statement"], s["calls_per_job"], s["rows_per_call"], s["exec_us_per_job"],
                      s["plan_us_per_job"], s["plans_per_call"], s["buffers_per_call"], s["wal_bytes_per_job"]]
                     for s in d["statements"]])
        print_table(["index of taskq.jobs", "scans/job", "entries read/job"],
                    [[i["index"], i["scans_per_job"], i["entries_read_per_job"]] for i in d["indexes"]])
    for h in heads:
        print(f"\nclaim batch {h['batch']}: {h['jobs']:,} jobs claimed; prepared claim: {h['generic_plans']} "
              f"generic / {h['custom_plans']} custom plans")
        print_table(["jobs done", "exec ms", "plan ms", "buffers", "claim scan buffers", "claim scan rows"],
                    [[s["done"], s["exec_ms"], s["plan_ms"], s["buffers"], s["scan_buffers"], s["scan_rows"]]
                     for s in h["samples"]])
    report = header("statements", vars(args) | {"json": str(args.json)}, info, server) | {
        "drains": drains, "head_of_queue": heads}
    print(f"wrote {write_report('statements', report, args.json)}")


if __name__ == "__main__":
    main()
