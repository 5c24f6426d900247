"""How exact fair share is (docs/fairness.md): the share of starts each fairness key gets, over every
window of 1,000 consecutive starts while both keys are busy, with 1 and 3 worker processes.

    python benchmarks/fairness.py [--dsn DSN] [--jobs 12000] [--workers 1,3] [--json out.json]

Scenarios, each run with every worker count (default worker settings, `benchmarks.apps:actors`, no-op jobs):
- `backlog 1:1` and `backlog 3:1`: keys A and B each enqueue `--jobs` jobs before the workers start (A
  first; weights 1:1, then A weighted 3);
- `live 1:1`: two producers, one per key, each enqueue batches of 50 without pause while the workers
  drain, with `--jobs` jobs each: the tags of concurrent producers, as in production;
- `late key`: A enqueues `--jobs` jobs; once the workers started 1,000 of them, B enqueues 50: how many
  starts after B's enqueue committed its last job started (the issue's bound: 150). A claim that began
  before the commit cannot see B's jobs; from then on B's 50 alternate with A's next 50.

The order of starts is the order of job_attempts by claim time, then claim order. A window counts only
while both keys are busy (before the first key runs out). Reported per scenario: the lowest and highest
share of A over the windows (and of the expected share), and the drain rate.
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
    announce,
    bench_database,
    header,
    machine,
    print_table,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from apps import NOOP, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
WINDOW = 1000


def reset(dsn: str, weight_a: float) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers, "
                     "taskq.fairness_weights")
        if weight_a != 1:
            conn.execute("INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('default', 'A', %s)",
                         (weight_a,))
        conn.execute("VACUUM ANALYZE taskq.jobs")


def start_order(dsn: str) -> list[tuple[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("""
            SELECT coalesce(j.fairness_key, ''), a.started_at FROM taskq.job_attempts AS a
            JOIN taskq.jobs AS j ON j.id = a.job_id
            ORDER BY a.started_at, j.priority, j.fair_tag NULLS FIRST, j.scheduled_at, j.id""").fetchall()
    return [(str(k), at) for k, at in rows]


def busy_shares(keys: list[str]) -> list[float]:
    """Share of A in each window of WINDOW consecutive starts before the first key ran out."""
    last_a = max((i for i, k in enumerate(keys) if k == "A"), default=-1)
    last_b = max((i for i, k in enumerate(keys) if k == "B"), default=-1)
    busy = keys[: min(last_a, last_b) + 1]
    return [busy[i:i + WINDOW].count("A") / WINDOW for i in range(0, len(busy) - WINDOW + 1)]


def wait_done(dsn: str, total: int, timeout: float = 600.0) -> float:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'").fetchone()
            if row and row[0] >= total:
                span = conn.execute("SELECT extract(epoch FROM max(finished_at) - min(started_at)) "
                                    "FROM taskq.jobs").fetchone()
                return float(span[0]) if span else 0.0
            time.sleep(0.1)
    raise RuntimeError("drain did not finish in time")


def started(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM taskq.job_attempts").fetchone()
    return int(row[0]) if row else 0


async def enqueue(dsn: str, key: str, jobs: int, batch: int = 1000) -> None:
    async with await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=1) as client:
        for i in range(0, jobs, batch):
            await client.enqueue_many(NOOP, range(i, min(jobs, i + batch)), fairness_key=key)


async def live_producers(dsn: str, jobs: int) -> None:
    await asyncio.gather(enqueue(dsn, "A", jobs, 50), enqueue(dsn, "B", jobs, 50))


def run_scenario(dsn: str, scenario: str, workers: int, jobs: int, logs: Path) -> dict[str, Any]:
    weight_a = 3.0 if scenario == "backlog 3:1" else 1.0
    reset(dsn, weight_a)
    expected = weight_a / (weight_a + 1)
    procs = []
    late_after: int | None = None
    b_committed: Any = None
    if scenario.startswith("backlog"):
        asyncio.run(enqueue(dsn, "A", jobs))
        asyncio.run(enqueue(dsn, "B", jobs))
        procs = [spawn_worker(dsn, APP, {}, logs / f"fairness-{i}.log") for i in range(workers)]
        total = 2 * jobs
    elif scenario == "live 1:1":
        procs = [spawn_worker(dsn, APP, {}, logs / f"fairness-{i}.log") for i in range(workers)]
        asyncio.run(live_producers(dsn, jobs))
        total = 2 * jobs
    else:  # late key
        asyncio.run(enqueue(dsn, "A", jobs))
        procs = [spawn_worker(dsn, APP, {}, logs / f"fairness-{i}.log") for i in range(workers)]
        deadline = time.monotonic() + 120
        while started(dsn) < 1000:
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start 1,000 jobs")
            time.sleep(0.01)
        asyncio.run(enqueue(dsn, "B", 50))
        # the enqueue has committed: a claim whose transaction starts from now on sees B's jobs
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT now()").fetchone()
        b_committed = row[0] if row else None
        total = jobs + 50
    try:
        seconds = wait_done(dsn, total)
    finally:
        stop_workers(procs)
    order = start_order(dsn)
    keys = [k for k, _ in order]
    result: dict[str, Any] = {"scenario": scenario, "workers": workers, "jobs": total,
                              "jobs_per_s": total / seconds if seconds else None}
    if scenario == "late key":
        # from the first claim after B's commit (it takes B's first job: B starts at the head), so that a
        # claim that ran between the commit and our look at the clock is not left out
        first_b = min(at for k, at in order if k == "B")
        since = min(first_b, b_committed)
        after = [k for k, at in order if at >= since]
        late_after = max(i for i, k in enumerate(after) if k == "B") + 1
        result |= {"b_last_start_after_enqueue": late_after, "bound": 150, "met": late_after <= 150}
    else:
        shares = busy_shares(keys)
        result |= {
            "expected_share_a": expected,
            "windows": len(shares),
            "min_share_a": min(shares) if shares else None,
            "max_share_a": max(shares) if shares else None,
            "median_share_a": statistics.median(shares) if shares else None,
            "max_deviation": max(abs(s - expected) for s in shares) if shares else None,
        }
        result["met"] = result["max_deviation"] is not None and result["max_deviation"] <= 0.05
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=12_000, help="jobs per key")
    parser.add_argument("--workers", default="1,3", help="worker process counts")
    parser.add_argument("--scenarios", default="backlog 1:1,backlog 3:1,live 1:1,late key")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "fairness.json")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    scenarios = args.scenarios.split(",")
    params = {"jobs_per_key": args.jobs, "workers": counts, "scenarios": scenarios, "window": WINDOW,
              "worker": "default settings", "actor": NOOP}
    info = machine()
    results = []
    with bench_database(args.dsn, "fairness") as dsn:
        server_info = server_facts(dsn)
        announce("fairness", params, info, server_info)
        for scenario in scenarios:
            for workers in counts:
                res = run_scenario(dsn, scenario, workers, args.jobs, RESULTS_DIR / "logs")
                results.append(res)
                print(f"  {scenario}, {workers} worker(s): {res}", flush=True)
    report = header("fairness", params, info, server_info) | {"machine_after": machine(), "results": results}
    print(f"\nfairness: windows of {WINDOW} consecutive starts while both keys are busy; "
          f"load average at start {info['loadavg']} on {info['cpus']} CPUs")
    print_table(
        ["scenario", "workers", "jobs/s", "share of A: expected", "min", "max", "max deviation", "met"],
        [[r["scenario"], r["workers"], r["jobs_per_s"], r.get("expected_share_a", "-"), r.get("min_share_a", "-"),
          r.get("max_share_a", "-"), r.get("max_deviation", "-"), r["met"]] for r in results if "windows" in r],
    )
    for r in results:
        if r["scenario"] == "late key":
            print(f"late key, {r['workers']} worker(s): B's last job was start {r['b_last_start_after_enqueue']} "
                  f"after B's enqueue (bound 150): {'met' if r['met'] else 'MISSED'}")
    print(f"wrote {write_report('fairness', report, args.json)}")


if __name__ == "__main__":
    main()
