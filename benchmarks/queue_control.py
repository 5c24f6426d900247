"""Queue control on the claim path: the backlog drain with and without a limit that never binds (beside
a baseline checkout of main), and the claim latency at light load with a per-key limit set.

    python benchmarks/queue_control.py [--dsn DSN] [--jobs 30000] [--workers 2] [--rounds 3]
        [--baseline-root /work/base-16 --baseline-python /work/venv-base16/bin/python]
        [--claims 400] [--rate 50] [--seconds 10] [--json out.json]

Drain: each round empties the tables, writes the backlog of no-op jobs with one INSERT (the same
statement for every variant, so the producer's code is not measured), then starts the worker processes
and waits until every job has succeeded; the figure is jobs / (max(finished_at) - min(started_at)).
The variants run interleaved, round by round, in one run:
- `baseline`: the workers of another checkout (`--baseline-root`, e.g. main before queue control) on a
  database that checkout migrated;
- `no limit`: this checkout, no queue control at all (the plain claim, job_claim);
- `limit never binds`: this checkout, the queue limited to 1,000,000 running jobs, so every claim is the
  limited one (lock the queue's row, count its running rows, claim) and the limit never stops a job.

Claim latency: one in-process WorkerStore against a backlog of 1,000 jobs spread over 10 concurrency
keys, claiming one job per call and finishing nothing (light load: one claimer); the round trip of
`claim` (no limit) and of `claim_limited` (queue per-key limit 1,000, never full), p50 / p99. Then the
enqueue -> start latency of one idle worker at `--rate` jobs/s, each job with one of 10 keys, with and
without a per-key limit of 2 on the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    announce,
    bench_database,
    header,
    machine,
    percentile,
    print_table,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from apps import NOOP, STAMP, registry

from taskq.backend import Backend
from taskq.client import JobsClient
from taskq.worker.store import WorkerStore

APP = "benchmarks.apps:actors"
NEVER_BINDS = 1_000_000
TARGET_OVERHEAD = 0.10

BACKLOG_SQL = ("INSERT INTO taskq.jobs (actor, payload) "
               "SELECT %s, to_jsonb(i) FROM generate_series(1, %s) AS i")


def reset(dsn: str, limit: int | None) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers")
        has_queues = conn.execute("SELECT to_regclass('taskq.queues') IS NOT NULL").fetchone()
        if has_queues and has_queues[0]:
            conn.execute("TRUNCATE taskq.queues, taskq.rate_starts")
            if limit is not None:
                conn.execute("INSERT INTO taskq.queues (name, concurrency_limit) VALUES ('default', %s)", (limit,))
        conn.execute("VACUUM ANALYZE taskq.jobs")


def spawn_baseline(dsn: str, args: argparse.Namespace, settings: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    command = [args.baseline_python, "-m", "taskq.worker", APP]
    for name, value in settings.items():
        command += ["--" + name.replace("_", "-"), str(value)]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        return subprocess.Popen(command, cwd=args.baseline_root, env=os.environ | {"TASKQ_DSN": dsn},
                                stdout=out, stderr=subprocess.STDOUT)


def drain_round(dsn: str, args: argparse.Namespace, variant: str, tag: str) -> dict[str, Any]:
    reset(dsn, NEVER_BINDS if variant == "limit never binds" else None)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BACKLOG_SQL, (NOOP, args.jobs))
        conn.execute("VACUUM ANALYZE taskq.jobs")
        settings = {"concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size}
        logs = RESULTS_DIR / "logs"
        procs = [spawn_baseline(dsn, args, settings, logs / f"qc-{tag}-w{i}.log") if variant == "baseline"
                 else spawn_worker(dsn, APP, settings, logs / f"qc-{tag}-w{i}.log") for i in range(args.workers)]
        deadline = time.monotonic() + args.timeout
        try:
            while True:
                row = conn.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'").fetchone()
                if row is not None and row[0] >= args.jobs:
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant}: still draining after {args.timeout:.0f}s")
                time.sleep(0.1)
        finally:
            stop_workers(procs)
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)),"
            " count(*) FILTER (WHERE attempt <> 1),"
            " (SELECT count(DISTINCT started_at) FROM taskq.job_attempts) FROM taskq.jobs"
        ).fetchone()
        assert row is not None
    drain, reattempted, claims = float(row[0]), int(row[1]), int(row[2])
    return {"variant": variant, "drain_s": drain, "jobs_per_s": args.jobs / drain, "reattempted": reattempted,
            "claim_statements": claims, "mean_claim_batch": args.jobs / claims if claims else None}


async def claim_latency(dsn: str, claims: int) -> dict[str, dict[str, float]]:
    backend = await Backend.open(dsn, min_size=1, max_size=2)
    out: dict[str, dict[str, float]] = {}
    try:
        for variant in ("no limit", "per-key limit"):
            reset(dsn, None)
            async with backend.pool.connection() as conn:
                await conn.execute(
                    "INSERT INTO taskq.jobs (actor, payload, concurrency_key) "
                    "SELECT %s, to_jsonb(i), 'tenant-' || (i %% 10) FROM generate_series(1, %s) AS i",
                    (NOOP, claims + 100))
                if variant == "per-key limit":
                    await conn.execute("INSERT INTO taskq.queues (name, concurrency_per_key) VALUES ('default', %s)",
                                       (NEVER_BINDS,))
                await conn.execute("ANALYZE taskq.jobs")
            store = WorkerStore(backend, f"bench-{variant.replace(' ', '-')}")
            await store.register(["default"], claims, 600.0)
            claim = store.claim_limited if variant == "per-key limit" else store.claim
            times: list[float] = []
            for _ in range(claims):
                started = time.perf_counter()
                got = await claim(["default"], 1, 600.0)
                times.append(1000 * (time.perf_counter() - started))
                assert len(got) == 1
            out[variant] = {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99),
                            "max_ms": max(times), "claims": float(len(times))}
    finally:
        await backend.close()
    return out


async def start_latency(dsn: str, rate: float, seconds: float, per_key: int | None) -> dict[str, float]:
    reset(dsn, None)
    if per_key is not None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO taskq.queues (name, concurrency_per_key) VALUES ('default', %s)", (per_key,))
    proc = spawn_worker(dsn, APP, {}, RESULTS_DIR / "logs" / f"qc-latency-{per_key}.log")
    try:
        async with await JobsClient.connect(dsn, registry=registry) as client:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the worker's LISTEN connection is up
                async with client.backend.pool.connection() as conn:
                    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                                             " AND query LIKE 'LISTEN%%'")
                    row = await cur.fetchone()
                if row and row[0]:
                    break
                await asyncio.sleep(0.05)
            handles = []
            total = int(rate * seconds)
            t0 = time.monotonic()
            for i in range(total):
                await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                handles.append(await client.enqueue(STAMP, time.time(), concurrency_key=f"tenant-{i % 10}"))
            lat = []
            for h in handles:
                row = await h.wait(timeout=60)
                lat.append(1000 * (float(row.result) - float(row.payload)))
    finally:
        stop_workers([proc])
    return {"p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99), "max_ms": max(lat), "jobs": float(len(lat))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=30_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--claim-batch-size", type=int, default=200)
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--baseline-root", default=None, help="checkout whose workers are the baseline")
    parser.add_argument("--baseline-python", default=None, help="python with that checkout installed")
    parser.add_argument("--claims", type=int, default=400)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "queue_control.json")
    args = parser.parse_args()
    params = {k: v for k, v in vars(args).items() if k not in ("dsn", "json")}
    info = machine()
    variants = ["no limit", "limit never binds"]
    if args.baseline_root and args.baseline_python:
        variants.insert(0, "baseline")
    rounds: list[dict[str, Any]] = []
    with bench_database(args.dsn, "qc") as dsn, bench_database(args.dsn, "qcbase") as base_dsn:
        if "baseline" in variants:
            # the baseline's own schema: drop ours and let its `taskq migrate` build it
            with psycopg.connect(base_dsn, autocommit=True) as conn:
                conn.execute("DROP SCHEMA taskq CASCADE")
            subprocess.run([args.baseline_python, "-m", "taskq.cli", "migrate"], cwd=args.baseline_root,
                           env=os.environ | {"TASKQ_DSN": base_dsn}, check=True, capture_output=True)
        server_info = server_facts(dsn)
        announce("queue_control", params, info, server_info)
        for r in range(args.rounds):
            for variant in variants:
                result = drain_round(base_dsn if variant == "baseline" else dsn, args, variant, f"r{r}-{variant[:4]}")
                result["round"] = r + 1
                rounds.append(result)
                print(f"  round {r + 1}/{args.rounds} {variant}: {result['jobs_per_s']:,.0f} jobs/s", file=sys.stderr)
        claims = asyncio.run(claim_latency(dsn, args.claims))
        starts = {"no limit": asyncio.run(start_latency(dsn, args.rate, args.seconds, None)),
                  "per-key limit 2": asyncio.run(start_latency(dsn, args.rate, args.seconds, 2))}
    drain = {v: statistics.median(r["jobs_per_s"] for r in rounds if r["variant"] == v) for v in variants}
    overhead = 1 - drain["limit never binds"] / drain["no limit"]
    report = header("queue_control", params, info, server_info) | {
        "machine_after": machine(), "drain_jobs_per_s": drain, "rounds": rounds,
        "limit_overhead_vs_no_limit": overhead, "claim_latency": claims, "start_latency": starts,
        "target": {"overhead_at_most": TARGET_OVERHEAD, "met": overhead <= TARGET_OVERHEAD},
    }
    print(f"\nbacklog drain: {args.jobs:,} no-op jobs, {args.workers} workers x concurrency {args.concurrency}, "
          f"claim batch {args.claim_batch_size}, {args.rounds} interleaved rounds (median)")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(["variant", "jobs/s", "rounds", "claim batch"],
                [[v, drain[v], " / ".join(f"{r['jobs_per_s']:,.0f}" for r in rounds if r["variant"] == v),
                  statistics.median(r["mean_claim_batch"] or 0 for r in rounds if r["variant"] == v)]
                 for v in variants])
    met = "met" if report["target"]["met"] else "MISSED"
    print(f"limit that never binds vs no limit: {100 * overhead:+.1f}% slower (target within "
          f"{100 * TARGET_OVERHEAD:.0f}%: {met})")
    print(f"\nclaim round trip, one job per claim, one claimer, {args.claims} claims")
    print_table(["claim", "p50 ms", "p99 ms", "max ms"],
                [[v, c["p50_ms"], c["p99_ms"], c["max_ms"]] for v, c in claims.items()])
    print(f"\nenqueue -> start, one idle worker, {args.rate:g} jobs/s for {args.seconds:g}s, 10 keys")
    print_table(["queue", "p50 ms", "p99 ms", "max ms"],
                [[v, c["p50_ms"], c["p99_ms"], c["max_ms"]] for v, c in starts.items()])
    print(f"wrote {write_report('queue_control', report, args.json)}")


if __name__ == "__main__":
    main()
