"""Retention under load: prune 1,000,000 old succeeded jobs while two workers drain a backlog.

    python benchmarks/prune.py [--dsn DSN] [--rows 1000000] [--jobs 50000] [--rounds 3]
                               [--concurrency 500] [--claim-batch-size 200] [--json out.json]

Each round runs two legs, in alternating order, each on a table freshly seeded with `--rows` succeeded
jobs that finished two days ago (each with its two state_change events and its attempts row, as a real
history has; ids are time-ordered UUIDv7, as taskq's own, which needs PostgreSQL 18):

1. drain only: `--jobs` pending no-op jobs drained by two worker processes, nothing pruned;
2. drain + prune: the backlog enqueued again, `taskq prune` started (a separate process, default
   windows: the seeded jobs are past the 1-day `retention_succeeded`; attempts rows kept), and the two
   workers started as soon as its first batch is deleted, so the whole drain runs during the prune.

The workers' own pruners are disabled (retention windows 0) so that only the measured prune deletes.
The drain figure is backlog jobs / (max(finished_at) - min(started_at)) from the rows themselves; the
prune rate is jobs deleted / the prune's own time, and separately the jobs it deleted from the workers'
start to the drain's end (counted on the retention index). Medians of the rounds.
Target: the drain during the prune at most 15 % slower than without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    REPO_ROOT,
    RESULTS_DIR,
    announce,
    bench_database,
    header,
    machine,
    print_table,
    reset_jobs,
    seed_history,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from apps import NOOP, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
OLD_ACTOR = "bench.old"
SEED_AGE = 2 * 86400.0
"""Seconds since the newest seeded job finished: past the default 1-day retention_succeeded."""
MAX_SLOWDOWN = 0.15
POLL_INTERVAL = 0.25
NO_PRUNING = {"retention_succeeded": 0, "retention_failed": 0, "retention_attempts": 0}

# index-only on jobs_retention_succeeded_idx: cheap enough to run twice a leg
OLD_LEFT_SQL = """
SELECT count(*) FROM taskq.jobs
WHERE status IN ('succeeded', 'cancelled') AND finished_at < now() - interval '1 day'
"""
UNFINISHED_SQL = "SELECT count(*) FROM taskq.jobs WHERE status IN ('pending', 'scheduled', 'running')"
DRAIN_SQL = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), extract(epoch FROM max(finished_at) - min(started_at))
FROM taskq.jobs WHERE actor = %(actor)s
"""
CLEAR_BACKLOG_SQL = """
WITH gone AS (DELETE FROM taskq.jobs WHERE actor = %(actor)s RETURNING id),
     ev AS (DELETE FROM taskq.job_events WHERE job_id IN (SELECT id FROM gone))
DELETE FROM taskq.job_attempts WHERE job_id IN (SELECT id FROM gone)
"""


async def enqueue_backlog(dsn: str, jobs: int, batch: int = 5_000) -> None:
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        for first in range(0, jobs, batch):
            await client.enqueue_many(NOOP, list(range(first, min(first + batch, jobs))))
    finally:
        await client.close()


def scalar(conn: psycopg.Connection[Any], query: str, params: dict[str, Any] | None = None) -> Any:
    row = conn.execute(query, params or {}).fetchone()
    assert row is not None
    return row[0]


def start_prune(dsn: str, log_path: Path) -> subprocess.Popen[bytes]:
    env = {"TASKQ_DSN": dsn, "TASKQ_RETENTION_ATTEMPTS": "0", "PATH": "/usr/bin:/bin"}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        return subprocess.Popen([sys.executable, "-m", "taskq.cli", "prune", "--json"], cwd=REPO_ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=log_file)


def drain_leg(dsn: str, args: argparse.Namespace, tag: str, *, with_prune: bool) -> dict[str, Any]:
    asyncio.run(enqueue_backlog(dsn, args.jobs))
    logs = RESULTS_DIR / "logs"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE taskq.jobs")
        old_before = scalar(conn, OLD_LEFT_SQL)
        pruner = start_prune(dsn, logs / f"prune-{tag}-cli.log") if with_prune else None
        old_at_start = old_before
        if pruner is not None:  # the workers start once the prune is deleting, so the drain runs inside it
            while old_at_start == old_before and pruner.poll() is None:
                time.sleep(0.05)
                old_at_start = scalar(conn, OLD_LEFT_SQL)
        prune_started = time.monotonic()
        settings = {"concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size} | NO_PRUNING
        procs = [spawn_worker(dsn, APP, settings, logs / f"prune-{tag}-w{i}.log") for i in range(2)]
        deadline = time.monotonic() + args.timeout
        try:
            while scalar(conn, UNFINISHED_SQL) > 0:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"backlog not drained after {args.timeout:.0f}s")
                time.sleep(POLL_INTERVAL)
            old_after_drain = scalar(conn, OLD_LEFT_SQL)
            drain_done = time.monotonic()
        finally:
            stop_workers(procs)
        done, drain_s = conn.execute(DRAIN_SQL, {"actor": NOOP}).fetchone() or (0, None)
        result: dict[str, Any] = {
            "with_prune": with_prune,
            "backlog_succeeded": int(done),
            "drain_s": float(drain_s or 0),
            "drain_jobs_per_s": int(done) / float(drain_s) if drain_s else None,
            "old_rows_before": int(old_before),
            "old_rows_after_drain": int(old_after_drain),
        }
        if pruner is not None:
            out, _ = pruner.communicate(timeout=args.timeout)
            if pruner.returncode != 0:
                raise RuntimeError(f"taskq prune exited {pruner.returncode}; see {logs}")
            pruned = json.loads(out)
            result.update({
                "pruned_jobs": pruned["succeeded"],
                "pruned_events": pruned["events"],
                "prune_s": pruned["seconds"],
                "prune_batches": pruned["batches"],
                "prune_jobs_per_s": pruned["succeeded"] / pruned["seconds"],
                "prune_rows_per_s": (pruned["succeeded"] + pruned["events"]) / pruned["seconds"],
                "pruned_during_drain": int(old_at_start) - int(old_after_drain),
                "prune_jobs_per_s_during_drain": (int(old_at_start) - int(old_after_drain))
                / max(1e-9, drain_done - prune_started),
                "old_rows_left": int(scalar(conn, OLD_LEFT_SQL)),
            })
        conn.execute(CLEAR_BACKLOG_SQL, {"actor": NOOP})
        conn.execute("VACUUM ANALYZE taskq.jobs")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--rows", type=int, default=1_000_000, help="old succeeded jobs seeded per round")
    parser.add_argument("--jobs", type=int, default=50_000, help="backlog drained per leg")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (each: drain only and drain + prune)")
    parser.add_argument("--concurrency", type=int, default=500, help="worker --concurrency")
    parser.add_argument("--claim-batch-size", type=int, default=200, help="worker --claim-batch-size")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a leg after this long")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "prune.json")
    args = parser.parse_args()
    params = {"rows": args.rows, "jobs": args.jobs, "rounds": args.rounds, "workers": 2,
              "concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size}
    info = machine()
    rounds: list[dict[str, Any]] = []
    with bench_database(args.dsn, "prune") as dsn:
        server_info = server_facts(dsn)
        announce("prune", params, info, server_info)
        for r in range(args.rounds):
            legs: dict[bool, dict[str, Any]] = {}
            seed_rates = []
            # alternate which leg goes first; each starts from a freshly seeded table
            for with_prune in (False, True) if r % 2 == 0 else (True, False):
                reset_jobs(dsn)
                seed_rates.append(seed_history(dsn, args.rows, actor=OLD_ACTOR, newest_age_s=SEED_AGE))
                legs[with_prune] = drain_leg(dsn, args, f"r{r + 1}-{'prune' if with_prune else 'drain'}",
                                             with_prune=with_prune)
            seed_rate = statistics.median(seed_rates)
            base, pruned = legs[False], legs[True]
            slowdown = 1 - pruned["drain_jobs_per_s"] / base["drain_jobs_per_s"]
            rounds.append({"seed_rows_per_s": seed_rate, "drain_only": base, "drain_with_prune": pruned,
                           "slowdown": slowdown})
            print(f"  round {r + 1}/{args.rounds}: drain {base['drain_jobs_per_s']:,.0f} jobs/s alone, "
                  f"{pruned['drain_jobs_per_s']:,.0f} during the prune ({100 * slowdown:+.1f} %); prune "
                  f"{pruned['prune_jobs_per_s']:,.0f} jobs/s overall, "
                  f"{pruned['prune_jobs_per_s_during_drain']:,.0f} during the drain", file=sys.stderr)

    def med(values: list[float]) -> float:
        return statistics.median(values)

    summary = {
        "drain_only_jobs_per_s": med([r["drain_only"]["drain_jobs_per_s"] for r in rounds]),
        "drain_with_prune_jobs_per_s": med([r["drain_with_prune"]["drain_jobs_per_s"] for r in rounds]),
        "slowdown": med([r["slowdown"] for r in rounds]),
        "prune_jobs_per_s": med([r["drain_with_prune"]["prune_jobs_per_s"] for r in rounds]),
        "prune_rows_per_s": med([r["drain_with_prune"]["prune_rows_per_s"] for r in rounds]),
        "prune_jobs_per_s_during_drain": med(
            [r["drain_with_prune"]["prune_jobs_per_s_during_drain"] for r in rounds]),
        "prune_s": med([r["drain_with_prune"]["prune_s"] for r in rounds]),
    }
    summary["target_met"] = summary["slowdown"] <= MAX_SLOWDOWN
    report = header("prune", params, info, server_info) | {"machine_after": machine(), "summary": summary,
                                                           "rounds": rounds}
    print(f"\nprune: {args.rows:,} old succeeded jobs (+{2 * args.rows:,} events) pruned by `taskq prune` while "
          f"2 workers drain {args.jobs:,} no-op jobs; load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(
        ["leg", "drain jobs/s", "rounds", "prune jobs/s", "prune rows/s", "prune jobs/s in drain", "prune s"],
        [
            ["drain only", summary["drain_only_jobs_per_s"],
             " / ".join(f"{r['drain_only']['drain_jobs_per_s']:,.0f}" for r in rounds), "-", "-", "-", "-"],
            ["drain + prune", summary["drain_with_prune_jobs_per_s"],
             " / ".join(f"{r['drain_with_prune']['drain_jobs_per_s']:,.0f}" for r in rounds),
             summary["prune_jobs_per_s"], summary["prune_rows_per_s"], summary["prune_jobs_per_s_during_drain"],
             summary["prune_s"]],
        ],
    )
    met = "met" if summary["target_met"] else "MISSED"
    print(f"drain slowdown during the prune: {100 * summary['slowdown']:.1f} % (target at most "
          f"{100 * MAX_SLOWDOWN:.0f} %: {met})")
    print(f"wrote {write_report('prune', report, args.json)}")


if __name__ == "__main__":
    main()
