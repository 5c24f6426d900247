"""Enqueue → actor start latency at a steady 50 jobs/s with one idle worker process, beside the lean loop
and a traced worker in the same run.

    python benchmarks/latency.py [--dsn DSN] [--rate 50] [--seconds 20] [--fairness-keys N] [--json out.json]

One worker subprocess (`python -m taskq.worker benchmarks.apps:actors`, default settings, so
`poll_interval` is 1 s and polling cannot explain a millisecond figure: the wake-up is the
LISTEN/NOTIFY path). The benchmark enqueues one job per commit with `JobsClient.enqueue` on a fixed
schedule; the payload is `time.time()` taken just before the call, and the actor returns
`time.time()` when it starts (same host, same clock). Reported: that difference (p50/p99/max), the
same measured from the moment `enqueue` returned (the commit is done), and the enqueue call itself.
`--fairness-keys N`: each job has one of N fairness keys in turn (a fair queue: docs/fairness.md).

Two more legs run at the same time, each on a database of its own at the same rate, their schedules
staggered with taskq's (latency.drive_many's way), so all three share the machine's seconds:
- the lean loop (benchmarks/lean_queue.py): a producer that inserts and notifies in one statement, and a
  worker that claims on NOTIFY and takes time.time() as each job starts: the floor (issue 34's target:
  taskq's p50 <= 1.25x and p99 <= 2x the lean loop's);
- a traced taskq worker (benchmarks/pickup_trace_app.py), whose actor returns when its job's NOTIFY
  reached the dispatcher, when the claim was sent and back, and when the job was spawned: where the
  time between the commit and the actor's start goes (the tracing adds a few microseconds, so the
  untraced leg's figures are the ones compared).
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from uuid import UUID

import lean_queue
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
from apps import STAMP, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
TRACE_APP = "benchmarks.pickup_trace_app:actors"
TRACE = "bench.trace"
LEAN_TARGET_P50 = 1.25
LEAN_TARGET_P99 = 2.0
TARGET_P50_MS = 2.0
TARGET_P99_MS = 10.0
WARMUP_JOBS = 20


def wait_for_listener(dsn: str, timeout: float = 30.0, workers: int = 1) -> None:
    """Until `workers` workers have registered and their LISTEN connections are up."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM taskq.workers),"
                " (SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                "  AND query LIKE 'LISTEN%%')"
            ).fetchone()
            if row is not None and row[0] >= workers and row[1] >= workers:
                return
            time.sleep(0.05)
    raise RuntimeError(f"{workers} worker(s) did not start listening in time")


async def wait_all_done(client: JobsClient, ids: list[UUID], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    async with client.backend.pool.connection() as conn:
        while time.monotonic() < deadline:
            cur = await conn.execute(
                "SELECT count(*) FROM taskq.jobs WHERE id = ANY(%s) AND status = 'succeeded'", (ids,)
            )
            row = await cur.fetchone()
            if row is not None and row[0] == len(ids):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError("jobs did not finish in time")


async def drive(dsn: str, rate: float, seconds: float, keys: int = 0) -> dict[str, Any]:
    return (await drive_many([dsn], rate, seconds, keys))[0]


async def drive_legs(dsn: str, traced_dsn: str, lean_dsn: str, rate: float, seconds: float,
                     keys: int = 0) -> dict[str, Any]:
    """taskq, the traced taskq worker and the lean loop at `rate` each, their schedules staggered."""
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=2)
    traced = await JobsClient.connect(traced_dsn, registry=registry, min_size=1, max_size=2)
    lean = await psycopg.AsyncConnection.connect(lean_dsn, autocommit=True)
    try:
        await wait_all_done(client, [(await client.enqueue(STAMP, time.time())).job_id for _ in range(WARMUP_JOBS)])
        await wait_all_done(traced, [(await traced.enqueue(TRACE, time.time())).job_id for _ in range(WARMUP_JOBS)])
        await _produce_lean(lean, time.perf_counter(), rate, WARMUP_JOBS)
        await asyncio.sleep(0.5)
        start = time.perf_counter() + 0.1
        count = int(rate * seconds)
        plain, through, lean_ids = await asyncio.gather(
            _produce(client, start, rate, count, keys),
            _produce(traced, start + 1 / (3 * rate), rate, count, keys, actor=TRACE),
            _produce_lean(lean, start + 2 / (3 * rate), rate, count),
        )
        return {"taskq": await _collect(client, *plain), "traced": await _collect_trace(traced, *through),
                "lean": await _collect_lean(lean, lean_ids)}
    finally:
        await lean.close()
        await traced.close()
        await client.close()


async def _produce_lean(conn: psycopg.AsyncConnection[Any], start: float, rate: float, count: int) -> list[int]:
    """The lean loop's producer on `start + i / rate`: one INSERT that notifies, per commit."""
    ids = []
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        cur = await conn.execute(lean_queue.INSERT_NOTIFY, ("default", str(time.time())), prepare=True)
        row = await cur.fetchone()
        assert row is not None
        ids.append(int(row[0]))
    return ids


async def _collect_lean(conn: psycopg.AsyncConnection[Any], ids: list[int], timeout: float = 30.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        cur = await conn.execute("SELECT payload::float8, result::float8 FROM lean.jobs WHERE id = ANY(%s)"
                                 " AND status = 'done'", (ids,))
        rows = await cur.fetchall()
        if len(rows) == len(ids):
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the lean worker did not finish in time")
        await asyncio.sleep(0.1)
    return {"jobs": len(rows), "enqueue_to_start_ms": stats([1000 * (r[1] - r[0]) for r in rows])}


TRACE_SEGMENTS = (
    ("enqueue call → NOTIFY at the dispatcher", "sent", "notified"),
    ("NOTIFY → claim sent", "notified", "claim_sent"),
    ("claim sent → rows back", "claim_sent", "claim_back"),
    ("rows back → spawned", "claim_back", "spawned"),
    ("spawned → actor start", "spawned", "started"),
    ("enqueue call → actor start", "sent", "started"),
)


async def _collect_trace(client: JobsClient, returned: dict[UUID, float], call_ms: list[float],
                         late: int) -> dict[str, Any]:
    """The traced jobs' timestamps, taken apart (TRACE_SEGMENTS). A job whose claim came before its NOTIFY
    reached the dispatcher (a poll, or the claim of an earlier job found it) has no NOTIFY segment of its
    own: its notified time is the earlier job's; such jobs are counted and left out of the NOTIFY rows."""
    ids = list(returned)
    await wait_all_done(client, ids)
    async with client.backend.pool.connection() as conn:
        cur = await conn.execute("SELECT payload::float8, result FROM taskq.jobs WHERE id = ANY(%s)", (ids,))
        rows = await cur.fetchall()
    marks = [r[1] | {"sent": r[0]} for r in rows if isinstance(r[1], dict) and "claim_sent" in r[1]]
    own = [m for m in marks if m["notified"] >= m["sent"]]
    segments: dict[str, Any] = {}
    for label, a, b in TRACE_SEGMENTS:
        chosen = own if "notified" in (a, b) else marks
        segments[label] = stats([1000 * (m[b] - m[a]) for m in chosen])
    return {"jobs": len(rows), "traced": len(marks), "claimed_before_their_notify": len(marks) - len(own),
            "segments_ms": segments}


async def drive_many(dsns: Sequence[str], rate: float, seconds: float, keys: int = 0) -> list[dict[str, Any]]:
    """`rate` jobs/s into each database for `seconds`, one job per commit, all databases at once: one
    producer task per database on its own schedule, the schedules staggered by 1 / (rate x databases)
    so that the commits interleave. Each database's figures then come from the same seconds of the
    machine's life, and what the machine does meanwhile (a checkpoint, a vacuum, another process) falls
    on all of them alike; and one database's slow commit does not hold back the others' enqueues, as it
    would if one loop took them in turn. Each database needs its own idle worker."""
    clients = [await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=2) for dsn in dsns]
    try:
        for client in clients:
            warm = [(await client.enqueue(STAMP, time.time())).job_id for _ in range(WARMUP_JOBS)]
            await wait_all_done(client, warm)
        await asyncio.sleep(0.5)
        start = time.perf_counter() + 0.1
        runs = await asyncio.gather(*(
            _produce(client, start + k / (rate * len(clients)), rate, int(rate * seconds), keys)
            for k, client in enumerate(clients)
        ))
        return [await _collect(client, *run) for client, run in zip(clients, runs, strict=True)]
    finally:
        for client in clients:
            await client.close()


async def _produce(client: JobsClient, start: float, rate: float, count: int, keys: int = 0,
                   actor: str = STAMP) -> tuple[dict[UUID, float], list[float], int]:
    """`count` jobs on the schedule `start + i / rate`; returns when each enqueue returned, how long each
    call took, and how many times the schedule was already past when a job was due."""
    returned: dict[UUID, float] = {}
    call_ms: list[float] = []
    late = 0
    for i in range(count):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            late += 1
        sent = time.time()
        if keys:
            handle = await client.enqueue(actor, sent, fairness_key=f"tenant-{i % keys}")
        else:
            handle = await client.enqueue(actor, sent)
        back = time.time()
        returned[handle.job_id] = back
        call_ms.append(1000 * (back - sent))
    return returned, call_ms, late


async def _collect(client: JobsClient, returned: dict[UUID, float], call_ms: list[float],
                   late: int) -> dict[str, Any]:
    ids = list(returned)
    await wait_all_done(client, ids)
    async with client.backend.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT id, payload::float8, result::float8,"
            " extract(epoch FROM started_at - created_at) FROM taskq.jobs WHERE id = ANY(%s)", (ids,)
        )
        rows = await cur.fetchall()
    return {
        "jobs": len(rows),
        "schedule_late_ticks": late,
        "enqueue_to_start_ms": stats([1000 * (r[2] - r[1]) for r in rows]),
        "commit_to_start_ms": stats([1000 * (r[2] - returned[r[0]]) for r in rows]),
        "enqueue_call_ms": stats(call_ms),
        "created_to_claimed_ms": stats([1000 * float(r[3]) for r in rows]),
    }


def stats(values: list[float]) -> dict[str, float]:
    return {
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--rate", type=float, default=50.0, help="jobs enqueued per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to keep enqueueing")
    parser.add_argument("--fairness-keys", type=int, default=0, help="one of N fairness keys per job, in turn")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "latency.json")
    args = parser.parse_args()
    params = {"rate": args.rate, "seconds": args.seconds, "fairness_keys": args.fairness_keys,
              "worker": "1 process, default settings "
              "(poll_interval 1 s, concurrency unset: 200)", "actor": STAMP}
    info = machine()
    logs = RESULTS_DIR / "logs"
    with (bench_database(args.dsn, "latency") as dsn, bench_database(args.dsn, "latency_traced") as traced_dsn,
          bench_database(args.dsn, "latency_lean") as lean_dsn):
        server_info = server_facts(dsn)
        announce("latency", params, info, server_info)
        with psycopg.connect(lean_dsn, autocommit=True) as conn:
            lean_queue.create(conn)
        procs = [spawn_worker(dsn, APP, {}, logs / "latency-worker.log"),
                 spawn_worker(traced_dsn, TRACE_APP, {}, logs / "latency-traced-worker.log")]
        with open(logs / "latency-lean-worker.log", "wb") as log_file:
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve().parent / "lean_queue.py"),
                                           "worker", lean_dsn], stdout=log_file, stderr=subprocess.STDOUT))
        try:
            wait_for_listener(dsn)
            wait_for_listener(traced_dsn)
            wait_for_lean_listener(lean_dsn)
            legs = asyncio.run(drive_legs(dsn, traced_dsn, lean_dsn, args.rate, args.seconds, args.fairness_keys))
        finally:
            codes = stop_workers(procs)
    result, lean, traced = legs["taskq"], legs["lean"], legs["traced"]
    ratio_p50 = result["enqueue_to_start_ms"]["p50"] / lean["enqueue_to_start_ms"]["p50"]
    ratio_p99 = result["enqueue_to_start_ms"]["p99"] / lean["enqueue_to_start_ms"]["p99"]
    report = header("latency", params, info, server_info) | {
        "machine_after": machine(),
        "worker_exit_code": codes[0],
        "results": result,
        "lean": lean,
        "traced": traced,
        "target": {"p50_ms": TARGET_P50_MS, "p99_ms": TARGET_P99_MS,
                   "met": result["enqueue_to_start_ms"]["p50"] <= TARGET_P50_MS
                   and result["enqueue_to_start_ms"]["p99"] <= TARGET_P99_MS},
        "lean_target": {"p50_ratio": ratio_p50, "p99_ratio": ratio_p99, "p50_max": LEAN_TARGET_P50,
                        "p99_max": LEAN_TARGET_P99,
                        "met": ratio_p50 <= LEAN_TARGET_P50 and ratio_p99 <= LEAN_TARGET_P99},
    }
    print(f"\nlatency: {result['jobs']} jobs at {args.rate:g} jobs/s, one idle worker process (poll_interval "
          f"1 s), load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    columns = ("p50", "p90", "p99", "max", "mean")
    print_table(
        ["measured (ms)", *columns],
        [[label, *(result[key][k] for k in columns)]
         for label, key in (("enqueue call → actor start", "enqueue_to_start_ms"),
                            ("enqueue returned → actor start", "commit_to_start_ms"),
                            ("enqueue call (insert + commit)", "enqueue_call_ms"),
                            ("created_at → claimed (server)", "created_to_claimed_ms"))]
        + [["lean loop: enqueue call → start", *(lean["enqueue_to_start_ms"][k] for k in columns)]],
    )
    if result["schedule_late_ticks"]:
        print(f"note: the enqueue loop fell behind its schedule {result['schedule_late_ticks']} times")
    met = "met" if report["target"]["met"] else "MISSED"
    print(f"target: p50 <= {TARGET_P50_MS:g} ms, p99 <= {TARGET_P99_MS:g} ms: {met}")
    lean_met = "met" if report["lean_target"]["met"] else "MISSED"
    print(f"against the lean loop: p50 {ratio_p50:.2f}x (target <= {LEAN_TARGET_P50:g}x), p99 {ratio_p99:.2f}x "
          f"(target <= {LEAN_TARGET_P99:g}x): {lean_met}")
    print(f"\nthe traced worker's jobs ({traced['traced']} traced, {traced['claimed_before_their_notify']} claimed "
          "before their own NOTIFY reached the dispatcher, left out of the NOTIFY rows), ms:")
    print_table(["segment", *columns], [[label, *(seg[k] for k in columns)]
                                        for label, seg in traced["segments_ms"].items()])
    print(f"wrote {write_report('latency', report, args.json)}")


def wait_for_lean_listener(dsn: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                               " AND query LIKE 'LISTEN lean_jobs%%'").fetchone()
            if row is not None and row[0] >= 1:
                return
            time.sleep(0.05)
    raise RuntimeError("the lean worker did not start listening in time")


if __name__ == "__main__":
    main()
