"""Job dependencies: fan-out, fan-in and a chain, with the cascade in the parent's terminal transaction.

    python benchmarks/workflows.py [--dsn DSN] [--fan-out 10000] [--fan-in 1000] [--chain 1000]
                                   [--rounds 3] [--json out.json]

- Fan-out: one parent with N children (enqueue_many with depends_on). The parent is claimed and finished
  with the worker's own statements (job_claim, job_finish_batch) from this process; the figure is the
  wall time of that terminal transaction (statement + commit), in which every child becomes pending.
  "Commit -> all claimable" is how long after that commit a fresh connection counts all N children
  pending (so: the cost of that count; they are claimable at the commit itself).
- Fan-in: N parents and one child, drained by one worker process (no-op actor, batched finishes). The
  figure is the child's started_at minus the last parent's finished_at (both the database's now()), and
  the child's settling event time minus that finished_at: how long after the last parent's terminal
  transaction began the child was released, and when a worker started it.
- Chain: N jobs each depending on the previous, one worker process; per link, the child's started_at
  minus its parent's finished_at (p50, p99, max): the worker wakes on the NOTIFY the cascade sends.
Medians of the rounds are reported; each round uses fresh rows.
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
    percentile,
    print_table,
    reset_jobs,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from apps import NOOP

from taskq import JobsClient, sql

APP = "benchmarks.apps:actors"
BENCH_WORKER = "bench-finisher"


def _wait_all_succeeded(dsn: str, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'").fetchone()
            if row and row[0] >= n:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {row[0] if row else 0} of {n} jobs succeeded after {timeout} s")
            time.sleep(0.05)


def fan_out(dsn: str, n: int) -> dict[str, float]:
    reset_jobs(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            parent = await client.enqueue(NOOP, 0, queue="fanout-parent")
            await client.enqueue_many(NOOP, list(range(n)), depends_on=[parent], queue="fanout-children")

    asyncio.run(enqueue())
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as other:
        conn.execute("VACUUM ANALYZE taskq.jobs")
        conn.execute("INSERT INTO taskq.workers (id, host, pid, queues, concurrency) "
                     "VALUES (%s, 'bench', 0, '{fanout-parent}', 1)", (BENCH_WORKER,))
        claimed = conn.execute(sql.query("job_claim"), {
            "queues": ["fanout-parent"], "limit": 1, "worker_id": BENCH_WORKER, "lock_timeout": 60.0,
        }).fetchall()
        job_id, attempt, epoch = claimed[0][0], claimed[0][4], claimed[0][6]
        params = {
            "ids": [job_id], "attempts": [attempt], "epochs": [epoch], "statuses": ["succeeded"],
            "results": [None], "error_classes": [None], "error_messages": [None], "retry_delays": [0.0],
            "outcomes": ["succeeded"], "details": [None], "first_traces": [None], "worker_id": BENCH_WORKER,
        }
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(sql.query("job_finish_batch"), params).fetchall()
        committed = time.perf_counter()
        row = other.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'pending' "
                            "AND queue = 'fanout-children'").fetchone()
        counted = time.perf_counter()
        assert row is not None and row[0] == n, row
    return {"terminal_tx_ms": (committed - started) * 1000, "commit_to_claimable_ms": (counted - committed) * 1000}


def _drain(dsn: str, total: int, tag: str, timeout: float) -> None:
    settings = {"concurrency": 200, "claim_batch_size": 100}
    procs = [spawn_worker(dsn, APP, settings, RESULTS_DIR / "logs" / f"workflows-{tag}.log")]
    try:
        _wait_all_succeeded(dsn, total, timeout)
    finally:
        stop_workers(procs)


def fan_in(dsn: str, n: int, timeout: float) -> dict[str, float]:
    reset_jobs(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            async with client.workflow() as wf:
                parents = [wf.enqueue(NOOP, i) for i in range(n)]
                wf.enqueue(NOOP, -1, depends_on=parents)

    asyncio.run(enqueue())
    _drain(dsn, n + 1, "fanin", timeout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("""
            SELECT extract(epoch FROM c.started_at - p.last) * 1000,
                   extract(epoch FROM e.at - p.last) * 1000
            FROM taskq.jobs AS c
            JOIN taskq.job_events AS e ON e.job_id = c.id AND e.from_status = 'awaiting_parents',
                 (SELECT max(finished_at) AS last FROM taskq.jobs WHERE dependency_mode IS NULL) AS p
            WHERE c.dependency_mode IS NOT NULL""").fetchone()
    assert row is not None
    return {"last_parent_to_child_started_ms": float(row[0]), "last_parent_to_child_released_ms": float(row[1])}


def chain(dsn: str, n: int, timeout: float) -> dict[str, float]:
    reset_jobs(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            async with client.workflow() as wf:
                prev = wf.enqueue(NOOP, 0)
                for i in range(1, n):
                    prev = wf.enqueue(NOOP, i, depends_on=[prev])

    asyncio.run(enqueue())
    started = time.perf_counter()
    _drain(dsn, n, "chain", timeout)
    wall = time.perf_counter() - started
    with psycopg.connect(dsn, autocommit=True) as conn:
        links = [float(r[0]) for r in conn.execute("""
            SELECT extract(epoch FROM c.started_at - p.finished_at) * 1000
            FROM taskq.job_dependencies AS d
            JOIN taskq.jobs AS p ON p.id = d.parent_id JOIN taskq.jobs AS c ON c.id = d.child_id""").fetchall()]
    return {"link_p50_ms": percentile(links, 50), "link_p99_ms": percentile(links, 99), "link_max_ms": max(links),
            "chain_wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--fan-out", type=int, default=10_000, help="children of the one parent")
    parser.add_argument("--fan-in", type=int, default=1_000, help="parents of the one child")
    parser.add_argument("--chain", type=int, default=1_000, help="jobs in the chain")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on a drain after this long")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "workflows.json")
    args = parser.parse_args()
    params = {"fan_out": args.fan_out, "fan_in": args.fan_in, "chain": args.chain, "rounds": args.rounds}
    info = machine()
    with bench_database(args.dsn, "workflows") as dsn:
        server = server_facts(dsn)
        announce("workflows", params, info, server)
        rounds: list[dict[str, float]] = []
        for i in range(args.rounds):
            figures = fan_out(dsn, args.fan_out) | fan_in(dsn, args.fan_in, args.timeout) \
                | chain(dsn, args.chain, args.timeout)
            print(f"round {i + 1}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()), flush=True)
            rounds.append(figures)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    targets: dict[str, tuple[str, float | None]] = {
        "terminal_tx_ms": (f"fan-out {args.fan_out:,}: the parent's terminal transaction (ms)", 200.0),
        "commit_to_claimable_ms": (f"fan-out {args.fan_out:,}: commit -> all children counted pending (ms)",
                                   1000.0),
        "last_parent_to_child_released_ms": (f"fan-in {args.fan_in:,}: last parent's finish -> child released "
                                             "(ms)", 100.0),
        "last_parent_to_child_started_ms": (f"fan-in {args.fan_in:,}: last parent's finish -> child started (ms)",
                                            None),
        "link_p50_ms": (f"chain {args.chain:,}: per-link latency p50 (ms)", None),
        "link_p99_ms": (f"chain {args.chain:,}: per-link latency p99 (ms)", None),
        "link_max_ms": (f"chain {args.chain:,}: per-link latency max (ms)", None),
        "chain_wall_s": (f"chain {args.chain:,}: whole chain, worker start to last success (s)", None),
    }
    print_table(("figure", "median", "target"),
                [(label, f"{medians[k]:.1f}", "-" if target is None else f"<= {target:g}")
                 for k, (label, target) in targets.items()])
    report: dict[str, Any] = header("workflows", params, info, server) | {"rounds": rounds, "medians": medians}
    path = write_report("workflows", report, args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
