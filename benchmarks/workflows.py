"""Job dependencies: fan-out, fan-in and a chain.

    python benchmarks/workflows.py [--dsn DSN] [--fan-out 10000] [--fan-in 1000] [--fan-in-batch 100]
                                   [--fan-in-repeats 5] [--chain 1000] [--chunk N] [--rounds 3]
                                   [--json out.json]

- Fan-out: one parent with N children (enqueue_many with depends_on). The parent is claimed and finished
  with the worker's own statements (job_claim, job_finish_batch) from this process, while one idle worker
  process runs (its resolver settles what the parent's transaction leaves beyond one chunk). Figures: the
  wall time of that terminal transaction (statement + commit), how many children it settled itself, and
  the time from its COMMIT until another connection counts all N children pending (claimable).
- Fan-in: N parents and one child. The parents are claimed and finished from this process in finish
  transactions of --fan-in-batch parents (as a worker's completer batches them). Figures: the last batch's
  transaction, and the time from its COMMIT until another connection sees the child pending. (Until
  issue 15's fourth session this figure was measured from the start of the last batch's transaction.)
  Then the same graph drained by one worker process, --fan-in-repeats times a round: the median of the
  child's started_at minus the last parent's finished_at (both now(), the start of their transactions;
  informational). One drain is one sample, which moves with how the worker's last batches fall.
- Chain: N jobs each depending on the previous, one worker process; per link, the child's started_at
  minus its parent's finished_at (p50, p99, max): the worker wakes on the NOTIFY the cascade sends.
Medians of the rounds are reported; each round uses fresh rows. Run with another interpreter (for example
a baseline checkout's venv) to measure that checkout: the script uses only the public client, the worker's
named queries and `python -m taskq.worker`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
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
from psycopg import sql as pgsql

from taskq import JobsClient, sql

APP = "benchmarks.apps:actors"
BENCH_WORKER = "bench-finisher"
POLL_S = 0.005


def _reset(dsn: str) -> None:
    reset_jobs(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('taskq.dependency_backlog')").fetchone() != (None,):
            conn.execute("TRUNCATE taskq.dependency_backlog")


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


def _idle_worker(dsn: str, tag: str, timeout: float = 60.0) -> subprocess.Popen[bytes]:
    """A worker serving a queue with no jobs: here only for its resolver (and its LISTEN). Returns once it
    is registered and listening."""
    proc = spawn_worker(dsn, APP, {"queues": "bench-idle", "concurrency": 1},
                        RESULTS_DIR / "logs" / f"workflows-{tag}.log")
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not conn.execute("SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN taskq_jobs%' "
                               "AND datname = current_database()").fetchone() == (1,):
            if proc.poll() is not None or time.monotonic() > deadline:
                stop_workers([proc])
                raise RuntimeError(f"the idle worker did not start (see its log under {RESULTS_DIR / 'logs'})")
            time.sleep(0.05)
    return proc


def _claim_as_bench(conn: psycopg.Connection[Any], queue: str, limit: int) -> list[tuple[Any, ...]]:
    conn.execute("INSERT INTO taskq.workers (id, host, pid, queues, concurrency) "
                 "VALUES (%s, 'bench', 0, %s, 1) ON CONFLICT (id) DO NOTHING", (BENCH_WORKER, [queue]))
    return conn.execute(sql.query("job_claim"), {
        "queues": [queue], "limit": limit, "worker_id": BENCH_WORKER, "lock_timeout": 600.0,
    }).fetchall()


def _finish_params(claimed: list[tuple[Any, ...]]) -> dict[str, Any]:
    """job_finish_batch parameters for these claimed rows, all succeeded (the worker's own statement)."""
    k = len(claimed)
    return {
        "ids": [c[0] for c in claimed], "attempts": [c[4] for c in claimed], "epochs": [c[6] for c in claimed],
        "statuses": ["succeeded"] * k, "results": [None] * k, "error_classes": [None] * k,
        "error_messages": [None] * k, "retry_delays": [0.0] * k, "outcomes": ["succeeded"] * k,
        "details": [None] * k, "first_traces": [None] * k, "wait_kinds": [None] * k, "wait_signals": [None] * k,
        "worker_id": BENCH_WORKER,
    }


def _poll(conn: psycopg.Connection[Any], statement: str, want: int, timeout: float) -> float:
    """perf_counter() when `statement` first returns `want`, polled every POLL_S (so the poll itself does not
    take a core from the work it waits for; the figure is late by at most POLL_S plus one count)."""
    deadline = time.perf_counter() + timeout
    while True:
        row = conn.execute(statement).fetchone()
        now = time.perf_counter()
        if row is not None and row[0] == want:
            return now
        if now > deadline:
            raise TimeoutError(f"{statement!r} gave {row} after {timeout} s, wanted {want}")
        time.sleep(POLL_S)


def fan_out(dsn: str, n: int) -> dict[str, float]:
    _reset(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            parent = await client.enqueue(NOOP, 0, queue="fanout-parent")
            await client.enqueue_many(NOOP, list(range(n)), depends_on=[parent], queue="fanout-children")

    asyncio.run(enqueue())
    resolver = _idle_worker(dsn, "fanout")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as other:
            conn.execute("VACUUM ANALYZE taskq.jobs")
            claimed = _claim_as_bench(conn, "fanout-parent", 1)
            started = time.perf_counter()
            with conn.transaction():
                conn.execute(sql.query("job_finish_batch"), _finish_params(claimed)).fetchall()
            committed = time.perf_counter()
            row = other.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'pending' "
                                "AND queue = 'fanout-children'").fetchone()
            in_parent_tx = int(row[0]) if row else 0
            released = _poll(other, "SELECT count(*) FROM taskq.jobs WHERE status = 'pending' "
                                    "AND queue = 'fanout-children'", n, timeout=60.0)
    finally:
        stop_workers([resolver])
    return {"terminal_tx_ms": (committed - started) * 1000, "commit_to_claimable_ms": (released - committed) * 1000,
            "fanout_settled_in_parent_tx": float(in_parent_tx)}


def _drain(dsn: str, total: int, tag: str, timeout: float) -> None:
    settings = {"concurrency": 200, "claim_batch_size": 100}
    procs = [spawn_worker(dsn, APP, settings, RESULTS_DIR / "logs" / f"workflows-{tag}.log")]
    try:
        _wait_all_succeeded(dsn, total, timeout)
    finally:
        stop_workers(procs)


def fan_in(dsn: str, n: int, batch: int) -> dict[str, float]:
    """N parents and one child. The parents are claimed and finished from here with the worker's own
    statements, `batch` parents per finish transaction (as a worker's completer batches them); the figures
    are the last batch's transaction (statement + commit: the child is settled inside it) and the time from
    that COMMIT until another connection sees the child pending, that is claimable."""
    _reset(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            async with client.workflow() as wf:
                parents = [wf.enqueue(NOOP, i, queue="fanin-parents") for i in range(n)]
                wf.enqueue(NOOP, -1, depends_on=parents, queue="fanin-child")

    asyncio.run(enqueue())
    with psycopg.connect(dsn, autocommit=True) as conn, psycopg.connect(dsn, autocommit=True) as other:
        conn.execute("VACUUM ANALYZE taskq.jobs")
        claimed = _claim_as_bench(conn, "fanin-parents", n)
        assert len(claimed) == n, len(claimed)
        for i in range(0, n - batch, batch):
            with conn.transaction():
                conn.execute(sql.query("job_finish_batch"), _finish_params(claimed[i:i + batch])).fetchall()
        last = claimed[(n - 1) // batch * batch:]
        started = time.perf_counter()
        with conn.transaction():
            conn.execute(sql.query("job_finish_batch"), _finish_params(last)).fetchall()
        committed = time.perf_counter()
        seen = _poll(other, "SELECT count(*) FROM taskq.jobs WHERE queue = 'fanin-child' AND status = 'pending'",
                     1, timeout=30.0)
    return {"fanin_last_batch_tx_ms": (committed - started) * 1000,
            "fanin_commit_to_claimable_ms": (seen - committed) * 1000}


def fan_in_worker(dsn: str, n: int, timeout: float, repeats: int) -> dict[str, float]:
    """The same graph drained by one worker process, `repeats` times: the median of the child's started_at
    minus the last parent's finished_at (both now(), that is the start of their transactions). One drain
    gives one sample, which moves with how the worker's last claim and finish batches fall."""
    samples = [_fan_in_worker_once(dsn, n, timeout) for _ in range(repeats)]
    print("  fan-in, 1 worker: " + " / ".join(f"{s:.1f}" for s in samples) + " ms", flush=True)
    return {"last_parent_to_child_started_ms": statistics.median(samples)}


def _fan_in_worker_once(dsn: str, n: int, timeout: float) -> float:
    _reset(dsn)

    async def enqueue() -> None:
        async with await JobsClient.connect(dsn) as client:
            async with client.workflow() as wf:
                parents = [wf.enqueue(NOOP, i) for i in range(n)]
                wf.enqueue(NOOP, -1, depends_on=parents)

    asyncio.run(enqueue())
    _drain(dsn, n + 1, "fanin", timeout)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("""
            SELECT extract(epoch FROM c.started_at - p.last) * 1000
            FROM taskq.jobs AS c,
                 (SELECT max(finished_at) AS last FROM taskq.jobs WHERE dependency_mode IS NULL) AS p
            WHERE c.dependency_mode IS NOT NULL""").fetchone()
    assert row is not None
    return float(row[0])


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
    parser.add_argument("--fan-in-batch", type=int, default=100, help="parents per finish transaction")
    parser.add_argument("--fan-in-repeats", type=int, default=5,
                        help="fan-in graphs drained by one worker per round (their median is the round's figure)")
    parser.add_argument("--chain", type=int, default=1_000, help="jobs in the chain")
    parser.add_argument("--chunk", type=int, default=None,
                        help="taskq.settle_chunk for the run (default: the migration's, 1,000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on a drain after this long")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "workflows.json")
    args = parser.parse_args()
    params = {"fan_out": args.fan_out, "fan_in": args.fan_in, "fan_in_batch": args.fan_in_batch, "chain": args.chain,
              "fan_in_repeats": args.fan_in_repeats, "rounds": args.rounds, "chunk": args.chunk}
    info = machine()
    with bench_database(args.dsn, "workflows") as dsn:
        if args.chunk is not None:  # every later connection (the workers' too) settles in chunks of this size
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(pgsql.SQL("ALTER DATABASE {} SET taskq.settle_chunk = {}").format(
                    pgsql.Identifier(conn.info.dbname), pgsql.Literal(str(args.chunk))))
        server = server_facts(dsn)
        announce("workflows", params, info, server)
        rounds: list[dict[str, float]] = []
        for i in range(args.rounds):
            figures = fan_out(dsn, args.fan_out) | fan_in(dsn, args.fan_in, args.fan_in_batch) \
                | fan_in_worker(dsn, args.fan_in, args.timeout, args.fan_in_repeats) \
                | chain(dsn, args.chain, args.timeout)
            print(f"round {i + 1}: " + ", ".join(f"{k}={v:.1f}" for k, v in figures.items()), flush=True)
            rounds.append(figures)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    targets: dict[str, tuple[str, float | None]] = {
        "terminal_tx_ms": (f"fan-out {args.fan_out:,}: the parent's terminal transaction (ms)", 200.0),
        "fanout_settled_in_parent_tx": (f"fan-out {args.fan_out:,}: children settled in that transaction", None),
        "commit_to_claimable_ms": (f"fan-out {args.fan_out:,}: its commit -> every child pending, 1 worker (ms)",
                                   1000.0),
        "fanin_last_batch_tx_ms": (f"fan-in {args.fan_in:,}: the last finish batch's transaction, "
                                   f"{args.fan_in_batch} parents (ms)", None),
        "fanin_commit_to_claimable_ms": (f"fan-in {args.fan_in:,}: the last parent's commit -> child pending (ms)",
                                         100.0),
        "last_parent_to_child_started_ms": (f"fan-in {args.fan_in:,}, 1 worker: last parent's finish (its "
                                            "transaction's start) -> child started (ms)", None),
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
