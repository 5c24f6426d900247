"""What the enqueue NOTIFY costs under concurrent producers.

    python benchmarks/notify.py [--dsn DSN] [--producers 8] [--seconds 3] [--rounds 3]
                                [--json benchmarks/results/notify.json]

Every committing transaction that called pg_notify takes PostgreSQL's global notify queue lock at
commit, so notifying commits from many sessions are serialised there. This runs `--producers` producer
processes, each on its own connection, inserting one job per commit with taskq's own `job_insert`
statement, and the same statement told not to notify (its notify parameter: the only difference), in
interleaved turns; then the same for batches of 100 (`job_insert_many`, one NOTIFY per statement).
Then the same producers through `JobsClient.enqueue` (one connection each): with a NOTIFY in every
insert (the coalescing window set to 0, as before coalescing), with the default coalescing
(backend_notify.NOTIFY_WINDOW), and with no NOTIFY at all (the floor).
It reports jobs/s and PostgreSQL CPU per job for each, medians of the rounds, and the NOTIFY's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    ServerCpu,
    announce,
    bench_database,
    cpu_between,
    cpu_snapshot,
    header,
    machine,
    print_table,
    reset_jobs,
    server_facts,
    write_report,
)

from taskq import sql
from taskq.backend_notify import NOTIFY_WINDOW
from taskq.client import JobsClient

CLIENT_MODES = {"client, NOTIFY per job": 0.0, f"client, coalesced ({NOTIFY_WINDOW * 1000:g} ms)": NOTIFY_WINDOW,
                "client, no NOTIFY": None}

BATCH = 100


def statements() -> dict[str, tuple[str, bool]]:
    """name -> (statement, its notify parameter): the shipped statements, with and without their NOTIFY."""
    single, many = sql.query("job_insert"), sql.query("job_insert_many")
    return {
        "single, NOTIFY": (single, True),
        "single, no NOTIFY": (single, False),
        "batch 100, NOTIFY": (many, True),
        "batch 100, no NOTIFY": (many, False),
    }


def params(batch: bool, notify: bool) -> dict[str, Any]:
    common = {"actor": "bench.notify", "queue": "default", "priority": 0, "tags": [], "max_attempts": 3,
              "scheduled_at": None, "schedule_to_close": None, "parent_id": None, "notify": notify,
              "idempotent": True, "concurrency_key": None}
    if batch:
        return common | {"ids": [uuid.uuid4() for _ in range(BATCH)], "payloads": ["{}"] * BATCH}
    return common | {"id": uuid.uuid4(), "payload": "{}"}


def produce(dsn: str, name: str, start_at: float, seconds: float, out: Any, stop: Any) -> None:
    """One producer: commits as fast as it can for `seconds` from `start_at`, puts its job count, and keeps
    its connection (whose server process the CPU accounting reads) until `stop`."""
    if name in CLIENT_MODES:
        asyncio.run(produce_with_client(dsn, CLIENT_MODES[name], start_at, seconds, out))
        stop.wait(60)
        return
    (statement, notify), batch = statements()[name], "batch" in name
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(3):  # warm: prepared, planned
            conn.execute(statement, params(batch, notify))  # type: ignore[arg-type, unused-ignore]
        while time.time() < start_at:
            time.sleep(0.001)
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            conn.execute(statement, params(batch, notify))  # type: ignore[arg-type, unused-ignore]
            jobs += BATCH if batch else 1
        out.put(jobs)
        stop.wait(60)


async def produce_with_client(dsn: str, window: float | None, start_at: float, seconds: float, out: Any) -> None:
    async with await JobsClient.connect(dsn, min_size=1, max_size=1) as client:
        notifier = client.backend.notifier
        if window is None:  # the floor: no insert notifies, and none is sent after
            notifier.inline = lambda queue: False  # type: ignore[method-assign]
            notifier.after_commit = lambda queue: None  # type: ignore[method-assign]
        else:
            notifier.window = window
        for i in range(3):
            await client.enqueue("bench.notify", i)
        await asyncio.sleep(max(0.0, start_at - time.time()))  # every producer starts at once
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            await client.enqueue("bench.notify", jobs)
            jobs += 1
        out.put(jobs)


def turn(dsn: str, name: str, producers: int, seconds: float, server: ServerCpu) -> dict[str, Any]:
    reset_jobs(dsn)
    ctx = multiprocessing.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    start_at = time.time() + 1.5
    procs = [ctx.Process(target=produce, args=(dsn, name, start_at, seconds, out, stop)) for _ in range(producers)]
    for p in procs:
        p.start()
    while time.time() < start_at:
        time.sleep(0.001)
    before = cpu_snapshot([], server)
    jobs = sum(out.get(timeout=seconds + 60) for _ in procs)
    after = cpu_snapshot([], server)
    stop.set()
    for p in procs:
        p.join(10)
    cpu = cpu_between(before, after)
    return {"jobs": jobs, "jobs_per_s": jobs / seconds,
            "server_us_per_job": (cpu["server_s"] or 0.0) / jobs * 1e6 if jobs else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    run_params = {"producers": args.producers, "seconds": args.seconds, "rounds": args.rounds}
    info = machine()
    with bench_database(args.dsn, "notify") as dsn:
        facts = server_facts(dsn)
        announce("notify", run_params, info, facts)
        server = ServerCpu(dsn)
        results: dict[str, list[dict[str, Any]]] = {}
        try:
            for r in range(args.rounds):
                for name in [*statements(), *CLIENT_MODES]:
                    result = turn(dsn, name, args.producers, args.seconds, server)
                    results.setdefault(name, []).append(result)
                    print(f"round {r + 1}: {name}: {result['jobs_per_s']:,.0f} jobs/s", flush=True)
        finally:
            server.close()
    summary = {name: {"jobs_per_s": statistics.median(x["jobs_per_s"] for x in runs),
                      "server_us_per_job": statistics.median(x["server_us_per_job"] or 0.0 for x in runs),
                      "rounds": runs}
               for name, runs in results.items()}
    rows = []
    for kind in ("single", "batch 100"):
        with_n, without = summary[f"{kind}, NOTIFY"], summary[f"{kind}, no NOTIFY"]
        rows.append([f"{kind}, NOTIFY", with_n["jobs_per_s"], with_n["server_us_per_job"],
                     f"{1 - with_n['jobs_per_s'] / without['jobs_per_s']:+.1%}"])
        rows.append([f"{kind}, no NOTIFY", without["jobs_per_s"], without["server_us_per_job"], ""])
    floor = summary["client, no NOTIFY"]
    for name in CLIENT_MODES:
        s_ = summary[name]
        rows.append([name, s_["jobs_per_s"], s_["server_us_per_job"],
                     f"{1 - s_['jobs_per_s'] / floor['jobs_per_s']:+.1%}" if s_ is not floor else ""])
    print()
    print(f"{args.producers} producers, medians of {args.rounds} rounds of {args.seconds:g} s")
    print_table(["enqueue", "jobs/s", "PG µs/job", "NOTIFY costs"], rows)
    print("(NOTIFY costs: jobs/s lost against the same path with no NOTIFY)")
    report = header("notify", run_params, info, facts) | {"results": summary}
    print(f"\nwrote {write_report('notify', report, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
