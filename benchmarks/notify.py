"""What the enqueue NOTIFY costs under concurrent producers.

    python benchmarks/notify.py [--dsn DSN] [--producers 8] [--seconds 3] [--rounds 3]
                                [--json benchmarks/results/notify.json]

Every committing transaction that called pg_notify takes PostgreSQL's global notify queue lock at
commit, so notifying commits from many sessions are serialised there. This runs `--producers` producer
processes, each on its own connection, inserting one job per commit with taskq's own `job_insert`
statement, and the same statement with the pg_notify call taken out (the only difference), in
interleaved turns; then the same for batches of 100 (`job_insert_many`, one NOTIFY per statement).
It reports jobs/s and PostgreSQL CPU per job for each, medians of the rounds, and the NOTIFY's cost.
"""

from __future__ import annotations

import argparse
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

NOTIFY_SINGLE = "(CASE WHEN status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n"
NOTIFY_MANY = "(CASE WHEN bool_or(status = 'pending') THEN pg_notify('taskq_jobs', %(queue)s::text) END) IS NULL AS _n"
BATCH = 100


def statements() -> dict[str, str]:
    single, many = sql.query("job_insert"), sql.query("job_insert_many")
    assert NOTIFY_SINGLE in single and NOTIFY_MANY in many, "the enqueue statements changed: update this benchmark"
    return {
        "single, NOTIFY": single,
        "single, no NOTIFY": single.replace(NOTIFY_SINGLE, "true AS _n"),
        "batch 100, NOTIFY": many,
        "batch 100, no NOTIFY": many.replace(NOTIFY_MANY, "true AS _n"),
    }


def params(batch: bool) -> dict[str, Any]:
    common = {"actor": "bench.notify", "queue": "default", "priority": 0, "tags": [], "max_attempts": 3,
              "scheduled_at": None, "schedule_to_close": None, "parent_id": None}
    if batch:
        return common | {"ids": [uuid.uuid4() for _ in range(BATCH)], "payloads": ["{}"] * BATCH}
    return common | {"id": uuid.uuid4(), "payload": "{}"}


def produce(dsn: str, statement: str, batch: bool, start_at: float, seconds: float, out: Any, stop: Any) -> None:
    """One producer: commits as fast as it can for `seconds` from `start_at`, puts its job count, and keeps
    its connection (whose server process the CPU accounting reads) until `stop`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(3):  # warm: prepared, planned
            conn.execute(statement, params(batch))  # type: ignore[arg-type, unused-ignore]
        while time.time() < start_at:
            time.sleep(0.001)
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            conn.execute(statement, params(batch))  # type: ignore[arg-type, unused-ignore]
            jobs += BATCH if batch else 1
        out.put(jobs)
        stop.wait(60)


def turn(dsn: str, name: str, statement: str, producers: int, seconds: float, server: ServerCpu) -> dict[str, Any]:
    reset_jobs(dsn)
    ctx = multiprocessing.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    start_at = time.time() + 1.0
    procs = [ctx.Process(target=produce, args=(dsn, statement, "batch" in name, start_at, seconds, out, stop))
             for _ in range(producers)]
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
                for name, statement in statements().items():
                    result = turn(dsn, name, statement, args.producers, args.seconds, server)
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
        cost = 1 - with_n["jobs_per_s"] / without["jobs_per_s"]
        for label, s in ((f"{kind}, NOTIFY", with_n), (f"{kind}, no NOTIFY", without)):
            rows.append([label, s["jobs_per_s"], s["server_us_per_job"],
                         f"{cost:+.1%}" if label.endswith(", NOTIFY") else ""])
    print()
    print(f"{args.producers} producers, medians of {args.rounds} rounds of {args.seconds:g} s")
    print_table(["enqueue", "jobs/s", "PG µs/job", "NOTIFY costs"], rows)
    report = header("notify", run_params, info, facts) | {"results": summary}
    print(f"\nwrote {write_report('notify', report, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
