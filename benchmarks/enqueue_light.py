"""A single enqueue's wall time at light load, taken apart: the share of `enqueue call → actor start`
(latency.py) that the producer's call takes, against the statements it is made of.

    python benchmarks/enqueue_light.py [--dsn DSN] [--calls 1000] [--pace-ms 20] [--json out.json]

At light load (latency.py enqueues 50 jobs/s) every step waits for an idle CPU to wake, so a call costs
several times its CPU. One connection each, autocommit, one call every `--pace-ms`, the variants in
rotation (the first tenth of the calls left out), wall time of the awaited call:

- `SELECT 1`: a round trip and nothing else;
- `lean insert`: the lean loop's insert-and-notify (benchmarks/lean_queue.py) into a table of its own;
- `3-column insert into taskq.jobs`: id, actor and payload, every other column its default: the table's
  indexes, checks and wider row;
- `job_insert`: the statement `client.enqueue` sends, with its notify, prepared, on a plain connection: the
  statement's other parameters and the fair-queue lookup;
- `client.enqueue`: the call itself (validation, the pool, the handle).

Each row's difference to the one above is what that step adds to a single enqueue at light load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import lean_queue
import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    bench_database,
    header,
    machine,
    percentile,
    print_table,
    server_facts,
    write_report,
)
from enqueue import _payload, registry, resize

from taskq import JobsClient, sql

TASKQ_INSERT = "INSERT INTO taskq.jobs (id, actor, payload) VALUES (gen_random_uuid(), 'bench.resize', %s::jsonb)"


async def measure(dsn: str, calls: int, pace: float) -> dict[str, list[float]]:
    async with await JobsClient.connect(dsn, registry=registry) as client, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        for statement in lean_queue.SCHEMA:
            await conn.execute(statement)
        counter = 0

        async def job_insert() -> None:
            params = client._prepare(resize, _payload(counter)).params()
            params["notify"] = True
            await conn.execute(sql.query("job_insert"), params, prepare=True)

        async def enqueue() -> None:
            await client.enqueue(resize, _payload(counter))

        async def select_1() -> None:
            await conn.execute("SELECT 1", prepare=True)

        async def lean() -> None:
            await conn.execute(lean_queue.INSERT_NOTIFY, ("default", json.dumps(_payload(counter))), prepare=True)

        async def narrow() -> None:
            await conn.execute(TASKQ_INSERT, (json.dumps(_payload(counter)),), prepare=True)

        variants: dict[str, Callable[[], Awaitable[None]]] = {
            "SELECT 1": select_1, "lean insert": lean, "3-column insert into taskq.jobs": narrow,
            "job_insert": job_insert, "client.enqueue": enqueue,
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for i in range(calls):
            counter = i
            for name, call in variants.items():
                await asyncio.sleep(pace)
                started = time.perf_counter()
                await call()
                times[name].append((time.perf_counter() - started) * 1000)
        return {name: values[calls // 10:] for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--calls", type=int, default=1000, help="calls of each variant")
    parser.add_argument("--pace-ms", type=float, default=20.0, help="idle time before each call")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "enqueue_light.json")
    args = parser.parse_args()
    if args.calls < 20 or args.pace_ms < 0:
        parser.error("--calls must be at least 20 and --pace-ms not negative")
    import uvloop

    params = {"calls": args.calls, "pace_ms": args.pace_ms}
    info = machine()
    with bench_database(args.dsn, "enqlight") as dsn:
        server = server_facts(dsn)
        times = uvloop.run(measure(dsn, args.calls, args.pace_ms / 1000))
    results: dict[str, Any] = {}
    rows = []
    previous: float | None = None
    for name, values in times.items():
        p50, p90, p99 = (percentile(values, q) for q in (50, 90, 99))
        results[name] = {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99}
        rows.append([name, f"{p50:.3f}", f"{p90:.3f}", f"{p99:.3f}",
                     "" if previous is None else f"{p50 - previous:+.3f}"])
        previous = p50
    print(f"\nwall time per call, ms, one call every {args.pace_ms:g} ms ({args.calls:,} calls of each, the first "
          "tenth left out)")
    print_table(["call", "p50", "p90", "p99", "p50 over the row above"], rows)
    report = header("enqueue_light", params, info, server) | {"results": results}
    print(f"wrote {write_report('enqueue_light', report, args.json)}", file=sys.stderr)


if __name__ == "__main__":
    main()
