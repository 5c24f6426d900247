"""SyncJobsClient against JobsClient: enqueue one job per call, and enqueue_many in batches of 100.

    python benchmarks/sync_client.py [--dsn DSN] [--seconds 2] [--rounds 5] [--json out.json]

One producer each (the async client on uvloop, the sync client in the main thread), the same registered
actor and payloads, on one fresh database; the jobs table is truncated before every turn. Each round runs
the four measurements in rotation for --seconds each; medians of the rounds are reported, with the sync
client's rate as a share of the async one's (target: >= 90 %).

What differs between the faces besides the loop: the async client coalesces the enqueue NOTIFY of a
burst (one per queue per 10 ms, plus a trailing one); the sync client sends it with every insert of a due
job (it has no loop to send a trailing one from), so a single enqueue's statement carries a NOTIFY each
time here.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import uvloop
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    announce,
    bench_database,
    header,
    machine,
    print_table,
    server_facts,
    write_report,
)
from pydantic import BaseModel

from taskq import JobsClient, SyncJobsClient
from taskq.actors.declaration import ActorRegistry, actor

TARGET_SHARE = 0.90
registry = ActorRegistry()


class Image(BaseModel):
    url: str
    width: int
    height: int


@actor(name="bench.sync.resize", registry=registry)
async def resize(payload: Image) -> None:
    return None


def _payload(i: int) -> dict[str, Any]:
    return {"url": f"s3://bucket/images/{i:08d}.png", "width": 640, "height": 480}


BATCH = [_payload(i) for i in range(100)]


def _truncate(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events")


def run_sync(client: SyncJobsClient, batch: bool, seconds: float) -> tuple[float, float]:
    """(jobs/s, client CPU microseconds per job) of one producer for `seconds`."""
    jobs = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if batch:
            client.enqueue_many(resize, BATCH)
            jobs += len(BATCH)
        else:
            client.enqueue(resize, BATCH[jobs % 100])
            jobs += 1
    return jobs / (time.perf_counter() - start), (time.process_time() - cpu) / jobs * 1e6


async def run_async(client: JobsClient, batch: bool, seconds: float) -> tuple[float, float]:
    jobs = 0
    cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        if batch:
            await client.enqueue_many(resize, BATCH)
            jobs += len(BATCH)
        else:
            await client.enqueue(resize, BATCH[jobs % 100])
            jobs += 1
    return jobs / (time.perf_counter() - start), (time.process_time() - cpu) / jobs * 1e6


def measure(dsn: str, seconds: float, rounds: int) -> dict[str, list[tuple[float, float]]]:
    results: dict[str, list[tuple[float, float]]] = {"sync 1": [], "async 1": [], "sync 100": [], "async 100": []}
    runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    aclient = runner.run(JobsClient.connect(dsn, registry=registry))
    sclient = SyncJobsClient.connect(dsn, registry=registry)
    try:
        # warm both (pool connections, prepared statements)
        run_sync(sclient, False, 0.3)
        runner.run(run_async(aclient, False, 0.3))
        plan: list[tuple[str, Callable[[], tuple[float, float]]]] = [
            ("sync 1", lambda: run_sync(sclient, False, seconds)),
            ("async 1", lambda: runner.run(run_async(aclient, False, seconds))),
            ("sync 100", lambda: run_sync(sclient, True, seconds)),
            ("async 100", lambda: runner.run(run_async(aclient, True, seconds))),
        ]
        for r in range(rounds):
            order = plan if r % 2 == 0 else plan[::-1]
            for name, step in order:
                _truncate(dsn)
                results[name].append(step())
    finally:
        sclient.close()
        runner.run(aclient.close())
        runner.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds; medians are reported")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "sync_client.json")
    args = parser.parse_args()
    params = {"seconds": args.seconds, "rounds": args.rounds}
    info = machine()
    with bench_database(args.dsn, "sync") as dsn:
        server = server_facts(dsn)
        announce("sync_client", params, info, server)
        results = measure(dsn, args.seconds, args.rounds)
    medians = {name: statistics.median(v[0] for v in values) for name, values in results.items()}
    cpu = {name: statistics.median(v[1] for v in values) for name, values in results.items()}
    rows = []
    summary: dict[str, Any] = {}
    for size in ("1", "100"):
        sync, asyn = medians[f"sync {size}"], medians[f"async {size}"]
        share = sync / asyn
        summary[size] = {"sync_jobs_per_s": sync, "async_jobs_per_s": asyn, "share": share,
                         "met": share >= TARGET_SHARE, "sync_client_cpu_us_per_job": cpu[f"sync {size}"],
                         "async_client_cpu_us_per_job": cpu[f"async {size}"]}
        rows.append([f"batch of {size}", asyn, sync, f"{share:.1%}", "yes" if share >= TARGET_SHARE else "NO",
                     cpu[f"async {size}"], cpu[f"sync {size}"]])
    print_table(["enqueue", "async jobs/s", "sync jobs/s", "sync/async", f">= {TARGET_SHARE:.0%}",
                 "async CPU us/job", "sync CPU us/job"], rows)
    report = header("sync_client", params, info, server) | {"rounds": results, "summary": summary}
    print(f"wrote {write_report('sync_client', report, args.json)}")


if __name__ == "__main__":
    main()
