"""SIGTERM with many in-flight cooperative jobs → every row released and the process exited.

    python benchmarks/shutdown.py [--dsn DSN] [--sizes 100,1000] [--json out.json]

A worker subprocess holds N jobs of `bench.sleep` (each returns to the queue as soon as its
`ctx.cancel_event` is set: the actors' own exit time is ~0). The benchmark sends SIGTERM and
measures until the process has exited, then checks that every row is back to `pending` with
interrupt_count 1 and attempt 1. Target: under 1 s beyond the actors' own exit time.
"""

from __future__ import annotations

import argparse
import signal
import time
from pathlib import Path

import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    announce,
    bench_database,
    header,
    machine,
    print_table,
    reset_jobs,
    server_facts,
    spawn_worker,
    write_report,
)
from apps import SLEEP

APP = "benchmarks.apps:actors"
TARGET_S = 1.0


def count(dsn: str, where: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM taskq.jobs WHERE {where}").fetchone()  # type: ignore[arg-type, unused-ignore]
    return int(row[0]) if row else 0


def one_size(dsn: str, n: int) -> dict[str, float | int]:
    reset_jobs(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO taskq.jobs (actor, payload) SELECT %s, '600' FROM generate_series(1, %s)",
                     (SLEEP, n))
    settings = {"concurrency": n + 10, "claim_batch_size": 500, "heartbeat_interval": 1.0, "lock_timeout": 30.0,
                "cancellation_grace_period": 10.0, "cleanup_grace_period": 5.0, "shutdown_timeout": 60.0}
    proc = spawn_worker(dsn, APP, settings, RESULTS_DIR / "logs" / f"shutdown-{n}.log")
    deadline = time.monotonic() + 60
    while count(dsn, "status = 'running'") < n:
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the worker did not claim every job")
        time.sleep(0.05)
    started = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(120)
    elapsed = time.perf_counter() - started
    released = count(dsn, "status = 'pending' AND interrupt_count = 1 AND attempt = 1 AND worker_id IS NULL")
    return {"jobs": n, "exit_s": elapsed, "released": released, "exit_code": code}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--sizes", default="100,1000")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "shutdown.json")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    params = {"sizes": sizes, "actor": SLEEP}
    info = machine()
    with bench_database(args.dsn, "shutdown") as dsn:
        server_info = server_facts(dsn)
        announce("shutdown", params, info, server_info)
        results = [one_size(dsn, n) for n in sizes]
    met = all(r["exit_s"] < TARGET_S and r["released"] == r["jobs"] and r["exit_code"] == 0 for r in results)
    report = header("shutdown", params, info, server_info) | {"results": results,
                                                             "target": {"seconds": TARGET_S, "met": met}}
    print(f"\nSIGTERM -> all released and exited; load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(["in flight", "SIGTERM -> exit (s)", "released", "exit code"],
                [[r["jobs"], r["exit_s"], r["released"], r["exit_code"]] for r in results])
    print(f"target: < {TARGET_S:g} s with every job released: {'met' if met else 'MISSED'}")
    print(f"wrote {write_report('shutdown', report, args.json)}")


if __name__ == "__main__":
    main()
