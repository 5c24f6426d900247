"""Queue control on the claim path: the backlog drain with and without a limit that never binds (beside
a baseline checkout of main), and the claim latency at light load with a per-key limit set.

    python benchmarks/queue_control.py [--dsn DSN] [--jobs 20000] [--workers 1,2] [--rounds 3]
        [--baseline-root /work/base --baseline-python /work/venv-base/bin/python]
        [--claims 400] [--rate 50] [--seconds 10] [--json out.json]

Drain: each round empties the tables, writes the backlog of no-op jobs with one INSERT (the same
statement for every variant, so the producer's code is not measured), then starts the worker processes
and waits until every job has succeeded; the figure is jobs / (max(finished_at) - min(started_at)), and
the CPU per job of the workers and of the PostgreSQL backends of the benchmark's database (from /proc,
between the first start and the last success: noise on a shared machine moves it much less than jobs/s).
The variants run interleaved, round by round and for each number of workers, in one run:
- `baseline`: the workers of another checkout (`--baseline-root`, e.g. main before this change) on a
  database that checkout migrated, no queue control;
- `baseline, limit never binds`: the same, with the queue limited to 1,000,000 running jobs (that
  checkout's limited claim), when the checkout has taskq.queues;
- `no limit`: this checkout, no queue control at all (the plain claim, job_claim);
- `limit never binds`: this checkout, the queue limited to 1,000,000 running jobs, so every claim is the
  limited one (lock the queue's scope, count its running rows, claim) and the limit never stops a job.

Claim latency: one in-process WorkerStore against a backlog of jobs spread over 10 concurrency keys,
claiming one job per call and finishing nothing (light load: one claimer); the round trip of `claim`
(no limit) and of `claim_limited` (queue per-key limit 1,000,000, never full), p50 / p99. Then the
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
    ServerCpu,
    announce,
    bench_database,
    cpu_between,
    cpu_snapshot,
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
from taskq.backend.workers import WorkerStore
from taskq.client import JobsClient

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


BASELINE_VARIANTS = ("baseline", "baseline, limit never binds")
LIMITED_VARIANTS = ("baseline, limit never binds", "limit never binds")


def drain_round(dsn: str, args: argparse.Namespace, variant: str, workers: int, tag: str) -> dict[str, Any]:
    reset(dsn, NEVER_BINDS if variant in LIMITED_VARIANTS else None)
    server = ServerCpu(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BACKLOG_SQL, (NOOP, args.jobs))
        conn.execute("VACUUM ANALYZE taskq.jobs")
        settings = {"concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size}
        logs = RESULTS_DIR / "logs"
        procs = [spawn_baseline(dsn, args, settings, logs / f"qc-{tag}-w{i}.log") if variant in BASELINE_VARIANTS
                 else spawn_worker(dsn, APP, settings, logs / f"qc-{tag}-w{i}.log") for i in range(workers)]
        pids = [p.pid for p in procs]
        deadline = time.monotonic() + args.timeout
        start = None
        try:
            while True:
                row = conn.execute("SELECT count(*) FILTER (WHERE status = 'succeeded'),"
                                   " count(*) FILTER (WHERE status <> 'pending') FROM taskq.jobs").fetchone()
                assert row is not None
                if start is None and row[1] > 0:  # the first claim: the workers' start-up is behind them
                    start = cpu_snapshot(pids, server)
                if row[0] >= args.jobs:
                    end = cpu_snapshot(pids, server)
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{variant}: still draining after {args.timeout:.0f}s")
                time.sleep(0.02)
        finally:
            stop_workers(procs)
            server.close()
        row = conn.execute(
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)),"
            " count(*) FILTER (WHERE attempt <> 1),"
            " (SELECT count(DISTINCT started_at) FROM taskq.job_attempts) FROM taskq.jobs"
        ).fetchone()
        assert row is not None
    assert start is not None
    cpu = cpu_between(start, end)
    worker_s = sum(cpu["processes_s"].values())
    drain, reattempted, claims = float(row[0]), int(row[1]), int(row[2])
    return {"variant": variant, "workers": workers, "drain_s": drain, "jobs_per_s": args.jobs / drain,
            "reattempted": reattempted, "claim_statements": claims,
            "mean_claim_batch": args.jobs / claims if claims else None,
            "worker_cpu_us_per_job": 1e6 * worker_s / args.jobs,
            "server_cpu_us_per_job": 1e6 * cpu["server_s"] / args.jobs if cpu["server_s"] is not None else None,
            "machine_busy_fraction": cpu["machine_busy_fraction"], "loadavg": machine()["loadavg"]}


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


def has_queue_control(python: str, root: str) -> bool:
    """Whether the baseline checkout has queue control (a limit for its limited claim to obey)."""
    return (Path(root) / "sql" / "0010_queue_control.sql").exists() and bool(python)


def median_of(rounds: list[dict[str, Any]], variant: str, workers: int, key: str) -> float | None:
    values = [r[key] for r in rounds if r["variant"] == variant and r["workers"] == workers and r[key] is not None]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--workers", default="1,2", help="worker process counts, comma-separated")
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
    worker_counts = [int(w) for w in args.workers.split(",")]
    params = {k: v for k, v in vars(args).items() if k not in ("dsn", "json")}
    info = machine()
    variants = ["no limit", "limit never binds"]
    if args.baseline_root and args.baseline_python:
        variants[:0] = ["baseline"] + (["baseline, limit never binds"]
                                       if has_queue_control(args.baseline_python, args.baseline_root) else [])
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
            for workers in worker_counts:
                for variant in variants:
                    tag = f"r{r}-w{workers}-{variant[:4]}{'-lim' if variant in LIMITED_VARIANTS else ''}"
                    result = drain_round(base_dsn if variant in BASELINE_VARIANTS else dsn, args, variant, workers, tag)
                    result["round"] = r + 1
                    rounds.append(result)
                    print(f"  round {r + 1}/{args.rounds} {workers} worker(s) {variant}:"
                          f" {result['jobs_per_s']:,.0f} jobs/s, {result['worker_cpu_us_per_job']:.0f}"
                          f" + {result['server_cpu_us_per_job'] or 0:.0f} us CPU/job, load {result['loadavg'][0]}",
                          file=sys.stderr)
        claims = asyncio.run(claim_latency(dsn, args.claims))
        starts = {"no limit": asyncio.run(start_latency(dsn, args.rate, args.seconds, None)),
                  "per-key limit 2": asyncio.run(start_latency(dsn, args.rate, args.seconds, 2))}
    drain: dict[str, dict[str, dict[str, float | None]]] = {}
    for workers in worker_counts:
        drain[str(workers)] = {v: {k: median_of(rounds, v, workers, k) for k in
                                   ("jobs_per_s", "worker_cpu_us_per_job", "server_cpu_us_per_job", "mean_claim_batch")}
                               for v in variants}

    def ratio(workers: int, variant: str, other: str, key: str) -> float | None:
        a, b = drain[str(workers)][variant][key], drain[str(workers)][other][key]
        return a / b - 1 if a is not None and b else None

    overhead: dict[str, float] = {}
    for w in worker_counts:
        slower = ratio(w, "limit never binds", "no limit", "jobs_per_s")
        overhead[str(w)] = -slower if slower is not None else float("nan")
    cpu_overhead = {str(w): ratio(w, "limit never binds", "no limit", "worker_cpu_us_per_job") for w in worker_counts}
    pg_cpu_overhead = {str(w): ratio(w, "limit never binds", "no limit", "server_cpu_us_per_job")
                       for w in worker_counts}
    worst = max(overhead.values())
    report = header("queue_control", params, info, server_info) | {
        "machine_after": machine(), "drain": drain, "rounds": rounds,
        "limit_overhead_vs_no_limit": overhead, "limit_worker_cpu_overhead_vs_no_limit": cpu_overhead,
        "limit_server_cpu_overhead_vs_no_limit": pg_cpu_overhead,
        "claim_latency": claims, "start_latency": starts,
        "target": {"overhead_at_most": TARGET_OVERHEAD, "met": worst <= TARGET_OVERHEAD},
    }
    print(f"\nbacklog drain: {args.jobs:,} no-op jobs, workers x concurrency {args.concurrency}, "
          f"claim batch {args.claim_batch_size}, {args.rounds} interleaved rounds (median; CPU in us per job)")
    if report["load_warning"]:
        print(report["load_warning"])
    rows = []
    for workers in worker_counts:
        for v in variants:
            d = drain[str(workers)][v]
            rows.append([workers, v, d["jobs_per_s"],
                         " / ".join(f"{r['jobs_per_s']:,.0f}" for r in rounds
                                    if r["variant"] == v and r["workers"] == workers),
                         d["worker_cpu_us_per_job"], d["server_cpu_us_per_job"], d["mean_claim_batch"]])
    print_table(["workers", "variant", "jobs/s", "rounds", "worker CPU", "PG CPU", "claim batch"], rows)
    for workers in worker_counts:
        key = str(workers)
        met = "met" if overhead[key] <= TARGET_OVERHEAD else "MISSED"
        cpu, pg = cpu_overhead[key], pg_cpu_overhead[key]
        print(f"{workers} worker(s): limit that never binds vs no limit: {100 * overhead[key]:+.1f}% slower"
              f" (target within {100 * TARGET_OVERHEAD:.0f}%: {met}); CPU/job: worker"
              f" {100 * cpu if cpu is not None else float('nan'):+.1f}%, PostgreSQL"
              f" {100 * pg if pg is not None else float('nan'):+.1f}%")
        if "baseline" in variants:
            b = ratio(workers, "no limit", "baseline", "jobs_per_s")
            print(f"  no limit vs baseline: {100 * b if b is not None else float('nan'):+.1f}% jobs/s")
        if "baseline, limit never binds" in variants:
            b = ratio(workers, "limit never binds", "baseline, limit never binds", "jobs_per_s")
            print(f"  limit never binds vs the baseline's: {100 * b if b is not None else float('nan'):+.1f}% jobs/s")
    print(f"\nclaim round trip, one job per claim, one claimer, {args.claims} claims")
    print_table(["claim", "p50 ms", "p99 ms", "max ms"],
                [[v, c["p50_ms"], c["p99_ms"], c["max_ms"]] for v, c in claims.items()])
    print(f"\nenqueue -> start, one idle worker, {args.rate:g} jobs/s for {args.seconds:g}s, 10 keys")
    print_table(["queue", "p50 ms", "p99 ms", "max ms"],
                [[v, c["p50_ms"], c["p99_ms"], c["max_ms"]] for v, c in starts.items()])
    print(f"wrote {write_report('queue_control', report, args.json)}")


if __name__ == "__main__":
    main()
