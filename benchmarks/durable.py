"""What durable jobs cost (docs/durable.md): steps, the signal-to-resume latency, and the drain of ordinary
jobs beside many suspended ones.

    python benchmarks/durable.py [--dsn DSN] [--jobs 20000] [--rounds 3] [--signals 200]
                                 [--suspended 100000] [--parts steps,signal,suspended] [--json out.json]

- `steps`: one worker (default settings, `benchmarks.apps:actors`) drains `--jobs` jobs of `bench.steps` with
  0, 1 and 10 no-op steps each, the three cases alternating in each round. Reported: jobs/s, worker and
  PostgreSQL CPU µs per job, and per step (the 1- and 10-step cases against the 0-step one, same round).
- `signal`: light load, one worker: a job waits for signal 'go' (suspended, no slot); the benchmark sends it
  and the job's rerun records when it resumed. `--signals` times, one at a time: p50 / p99 / max of
  resume minus send (`time.time()` on this host), with LISTEN (the default).
- `suspended`: the drain of `--jobs` no-op jobs by one worker with `--suspended` jobs suspended in the same
  queue (half sleeping for a day, half waiting for a signal without timeout: what ctx.sleep and
  ctx.wait_for_signal leave, written directly), against the same drain with none, alternating per round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
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
from apps import NOOP, STEPS, WAITER, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.job_steps, "
                     "taskq.job_signals")
        conn.execute("VACUUM ANALYZE taskq.jobs")


async def enqueue(dsn: str, actor: str, payloads: list[int], batch: int = 1000) -> None:
    async with await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=1) as client:
        for i in range(0, len(payloads), batch):
            await client.enqueue_many(actor, payloads[i:i + batch])


def finished(dsn: str, actor: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM taskq.jobs WHERE actor = %s AND status = 'succeeded'",
                           (actor,)).fetchone()
    return int(row[0]) if row else 0


def drain(dsn: str, actor: str, total: int, logs: Path, name: str) -> dict[str, Any]:
    """Start one worker on a backlog already written, measure until `total` jobs of `actor` succeeded."""
    server = ServerCpu(dsn)
    proc = spawn_worker(dsn, APP, {}, logs / f"durable-{name}.log")
    try:
        deadline = time.monotonic() + 600
        while finished(dsn, actor) == 0:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the worker did not start (log: {logs / f'durable-{name}.log'})")
            time.sleep(0.005)
        start = cpu_snapshot([proc.pid], server)
        first = finished(dsn, actor)
        while (done := finished(dsn, actor)) < total:
            if time.monotonic() > deadline:
                raise RuntimeError("the drain did not finish in time")
            time.sleep(0.02)
        end = cpu_snapshot([proc.pid], server)
    finally:
        stop_workers([proc])
        server.close()
    spent = cpu_between(start, end)
    jobs = done - first
    worker_s = sum(spent["processes_s"].values())
    return {
        "jobs": jobs, "seconds": spent["wall_s"], "jobs_per_s": jobs / spent["wall_s"],
        "worker_us_per_job": worker_s / jobs * 1e6,
        "pg_us_per_job": spent["server_s"] / jobs * 1e6 if spent["server_s"] is not None else None,
        "machine_busy": spent["machine_busy_fraction"],
    }


def part_steps(dsn: str, jobs: int, rounds: int, logs: Path) -> list[dict[str, Any]]:
    results = []
    for r in range(rounds):
        for steps in (0, 1, 10):
            reset(dsn)
            asyncio.run(enqueue(dsn, STEPS, [steps] * jobs))
            res = drain(dsn, STEPS, jobs, logs, f"steps{steps}") | {"round": r + 1, "steps": steps}
            results.append(res)
            print(f"  round {r + 1}: {steps} steps: {res['jobs_per_s']:,.0f} jobs/s, worker "
                  f"{res['worker_us_per_job']:.0f} µs/job, PG {res['pg_us_per_job']:.0f} µs/job", flush=True)
    return results


async def _signal_round(dsn: str, signals: int) -> list[float]:
    latencies = []
    async with await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=2) as client:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for i in range(signals):
                handle = await client.enqueue(WAITER, i)
                deadline = time.monotonic() + 30
                while True:
                    row = conn.execute("SELECT status, wait_kind FROM taskq.jobs WHERE id = %s",
                                       (handle.job_id,)).fetchone()
                    if row == ("scheduled", "signal"):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError("the job did not suspend")
                    await asyncio.sleep(0.002)
                sent = time.time()
                await client.signal(handle.job_id, "go", i)
                resumed = (await handle.wait(timeout=30)).result
                latencies.append((float(resumed) - sent) * 1000)
    return latencies


def part_signal(dsn: str, signals: int, logs: Path) -> dict[str, Any]:
    reset(dsn)
    proc = spawn_worker(dsn, APP, {}, logs / "durable-signal.log")
    try:
        time.sleep(1.0)  # the worker's start; the first job waits for it anyway
        latencies = asyncio.run(_signal_round(dsn, signals))
    finally:
        stop_workers([proc])
    return {"signals": len(latencies), "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
            "max_ms": max(latencies), "mean_ms": statistics.fmean(latencies)}


def write_suspended(dsn: str, n: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO taskq.jobs (actor, payload, status, scheduled_at, wait_kind, wait_signal, attempt,
                                    claim_epoch)
            SELECT %(actor)s, '0'::jsonb, 'scheduled',
                   CASE WHEN g %% 2 = 0 THEN now() + interval '1 day' ELSE '9999-12-31 00:00:00+00' END,
                   CASE WHEN g %% 2 = 0 THEN 'sleep' ELSE 'signal' END,
                   CASE WHEN g %% 2 = 0 THEN NULL ELSE 'go' END, 1, 1
            FROM generate_series(1, %(n)s) AS g""", {"actor": WAITER, "n": n})
        conn.execute("VACUUM ANALYZE taskq.jobs")


def part_suspended(dsn: str, jobs: int, suspended: int, rounds: int, logs: Path) -> list[dict[str, Any]]:
    results = []
    for r in range(rounds):
        for count in (0, suspended):
            reset(dsn)
            if count:
                write_suspended(dsn, count)
            asyncio.run(enqueue(dsn, NOOP, list(range(jobs))))
            res = drain(dsn, NOOP, jobs, logs, f"suspended{count}") | {"round": r + 1, "suspended": count}
            results.append(res)
            print(f"  round {r + 1}: {count:,} suspended: {res['jobs_per_s']:,.0f} jobs/s, PG "
                  f"{res['pg_us_per_job']:.0f} µs/job", flush=True)
    return results


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--signals", type=int, default=200)
    parser.add_argument("--suspended", type=int, default=100_000)
    parser.add_argument("--parts", default="steps,signal,suspended")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "durable.json")
    args = parser.parse_args()
    parts = args.parts.split(",")
    params = {"jobs": args.jobs, "rounds": args.rounds, "signals": args.signals, "suspended": args.suspended,
              "parts": parts, "worker": "default settings, 1 process"}
    info = machine()
    logs = RESULTS_DIR / "logs"
    report: dict[str, Any] = {}
    with bench_database(args.dsn, "durable") as dsn:
        server_info = server_facts(dsn)
        announce("durable", params, info, server_info)
        if "steps" in parts:
            report["steps"] = part_steps(dsn, args.jobs, args.rounds, logs)
        if "signal" in parts:
            report["signal"] = part_signal(dsn, args.signals, logs)
            print(f"  signal: {report['signal']}", flush=True)
        if "suspended" in parts:
            report["suspended"] = part_suspended(dsn, args.jobs, args.suspended, args.rounds, logs)
    out = header("durable", params, info, server_info) | {"machine_after": machine()} | report
    print(f"\ndurable: load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if "steps" in report:
        rows = report["steps"]
        base = {r["round"]: r for r in rows if r["steps"] == 0}
        table = []
        for steps in (0, 1, 10):
            mine = [r for r in rows if r["steps"] == steps]
            per_step_worker = [(r["worker_us_per_job"] - base[r["round"]]["worker_us_per_job"]) / steps
                               for r in mine] if steps else [0.0]
            per_step_pg = [(r["pg_us_per_job"] - base[r["round"]]["pg_us_per_job"]) / steps
                           for r in mine] if steps else [0.0]
            table.append([steps, _median(mine, "jobs_per_s"), _median(mine, "worker_us_per_job"),
                          _median(mine, "pg_us_per_job"), statistics.median(per_step_worker),
                          statistics.median(per_step_pg)])
        print_table(["steps per job", "jobs/s", "worker µs/job", "PG µs/job", "worker µs/step", "PG µs/step"],
                    table)
    if "signal" in report:
        s = report["signal"]
        print(f"signal -> resume: p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, max {s['max_ms']:.1f} ms "
              f"over {s['signals']} signals (target p99 <= 50 ms)")
    if "suspended" in report:
        rows = report["suspended"]
        none = [r for r in rows if r["suspended"] == 0]
        many = [r for r in rows if r["suspended"]]
        ratio = _median(many, "jobs_per_s") / _median(none, "jobs_per_s")
        print_table(["suspended jobs", "jobs/s (median)", "rounds", "PG µs/job"],
                    [[0, _median(none, "jobs_per_s"), " / ".join(f"{r['jobs_per_s']:,.0f}" for r in none),
                      _median(none, "pg_us_per_job")],
                     [args.suspended, _median(many, "jobs_per_s"),
                      " / ".join(f"{r['jobs_per_s']:,.0f}" for r in many), _median(many, "pg_us_per_job")]])
        print(f"drain beside {args.suspended:,} suspended jobs: {ratio:.3f} of the drain without (target >= 0.95)")
    print(f"wrote {write_report('durable', out, args.json)}")


if __name__ == "__main__":
    main()
