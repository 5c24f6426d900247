"""Cancel request → the running actor's `cancel_event` set, over LISTEN/NOTIFY and by polling only.

    python benchmarks/cancel_latency.py [--dsn DSN] [--cancels 200] [--json out.json]

One worker subprocess holds `--cancels` jobs of `bench.wait_cancel`, each waiting on its
`ctx.cancel_event` and returning `time.time()` the moment it is set. The benchmark cancels them one
by one (`JobsClient.cancel`, 20 ms apart) and compares the moment each call started with the
actor's stamp (same host, same clock). Mode "notify": heartbeat_interval 1 s, LISTEN up. Mode
"polling only": the same worker with an unreachable listen_dsn, so only the 1 s heartbeat poll
delivers. Target: p99 under 100 ms with NOTIFY.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from uuid import UUID

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
from apps import WAIT_CANCEL, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
TARGET_P99_MS = 100.0
SPACING = 0.02


async def wait_count(client: JobsClient, ids: list[UUID], status: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    async with client.backend.pool.connection() as conn:
        while time.monotonic() < deadline:
            cur = await conn.execute("SELECT count(*) FROM taskq.jobs WHERE id = ANY(%s) AND status = %s",
                                     (ids, status))
            row = await cur.fetchone()
            if row is not None and row[0] == len(ids):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"jobs did not all reach {status} in time")


async def drive(dsn: str, cancels: int) -> list[float]:
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=2)
    try:
        handles = await client.enqueue_many(WAIT_CANCEL, [600.0] * cancels)
        ids = [h.job_id for h in handles]
        await wait_count(client, ids, "running")
        sent: dict[UUID, float] = {}
        for job_id in ids:
            sent[job_id] = time.time()
            await client.cancel(job_id)
            await asyncio.sleep(SPACING)
        await wait_count(client, ids, "succeeded")
        async with client.backend.pool.connection() as conn:
            cur = await conn.execute("SELECT id, result::float8 FROM taskq.jobs WHERE id = ANY(%s)", (ids,))
            rows = await cur.fetchall()
    finally:
        await client.close()
    return [1000 * (stamp - sent[job_id]) for job_id, stamp in rows]


def stats(values: list[float]) -> dict[str, float]:
    return {"p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values), "n": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--cancels", type=int, default=200)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "cancel_latency.json")
    args = parser.parse_args()
    base = {"heartbeat_interval": 1.0, "lock_timeout": 30.0, "concurrency": args.cancels + 10,
            "cancellation_grace_period": 60.0, "poll_interval": 0.2}
    modes = {
        "notify": base,
        "polling only": base | {"listen_dsn": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"},
    }
    params = {"cancels": args.cancels, "spacing_s": SPACING, "worker": base}
    info = machine()
    results: dict[str, dict[str, float]] = {}
    with bench_database(args.dsn, "cancel") as dsn:
        server_info = server_facts(dsn)
        announce("cancel_latency", params, info, server_info)
        for mode, settings in modes.items():
            reset_jobs(dsn)
            proc = spawn_worker(dsn, APP, settings, RESULTS_DIR / "logs" / f"cancel-{mode.replace(' ', '-')}.log")
            try:
                results[mode] = stats(asyncio.run(drive(dsn, args.cancels)))
            finally:
                stop_workers([proc])
    met = results["notify"]["p99"] < TARGET_P99_MS
    report = header("cancel_latency", params, info, server_info) | {
        "results": results, "target": {"p99_ms_notify": TARGET_P99_MS, "met": met},
    }
    print(f"\ncancel request -> cancel_event set, {args.cancels} cancels per mode, one worker process, "
          f"heartbeat_interval 1 s; load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(["mode", "p50 ms", "p99 ms", "max ms", "cancels"],
                [[m, r["p50"], r["p99"], r["max"], int(r["n"])] for m, r in results.items()])
    print(f"target: p99 < {TARGET_P99_MS:g} ms with NOTIFY: {'met' if met else 'MISSED'}")
    print(f"wrote {write_report('cancel_latency', report, args.json)}")



if __name__ == "__main__":
    main()
