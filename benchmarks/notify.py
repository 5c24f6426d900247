"""What the enqueue NOTIFY costs under concurrent producers.

    python benchmarks/notify.py [--dsn DSN] [--producers 8] [--seconds 3] [--rounds 3] [--only A,B]
                                [--json benchmarks/results/notify.json]

A transaction that called pg_notify takes PostgreSQL's global notify lock at commit and holds it until its
commit is over, WAL flush included, so notifying commits from many sessions are serialised there. This
runs `--producers` producer processes, each on its own connection, inserting one job per commit with
taskq's own `job_insert` statement: with the NOTIFY in the insert (its notify parameter), with the
insert told not to notify and a `jobs_notify` statement of its own right after the commit, and with no
NOTIFY; in interleaved turns; then the same for batches of 100 (`job_insert_many`). Then the same
producers through `JobsClient.enqueue` and `SyncJobsClient.enqueue` (see CLIENT_MODES).

Each turn also counts the notifying commits (notifications arriving on a LISTEN connection: PostgreSQL
folds duplicates only within a transaction) and samples pg_stat_activity every 5 ms for what the
producers' backends are doing (`Lock:object` is the notify lock; `LWLock:WALWrite` / `IO:WalSync` the
commit flush; `idle` is time in the client). It reports jobs/s, PostgreSQL CPU per job and both of those
for each mode, medians of the rounds, and the NOTIFY's cost against the same path without one.

Run with another venv's python (`/work/venv-base/bin/python benchmarks/notify.py --dsn DSN`), the same
script measures that venv's taskq: alternate the two for a side-by-side comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import multiprocessing
import statistics
import threading
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
    percentile,
    print_table,
    reset_jobs,
    server_facts,
    write_report,
)

import taskq
from taskq import SyncJobsClient, sql
from taskq.client import JobsClient

CLIENT_MODES = ("client, default", "client, NOTIFY in the insert", "client, no NOTIFY",
                "sync client, default", "sync client, no NOTIFY")
"""default: what the client does unchanged (since session 7: a quiet queue's insert carries its NOTIFY, a
busy queue's follow its commits, coalesced in a window that widens from backend_notify.NOTIFY_WINDOW to
NOTIFY_WINDOW_MAX); in the insert: every insert notifies in its own transaction, as before
coalescing; no NOTIFY: the floor. The script also runs against an older taskq (another venv's python):
each mode is set up through what that version's notifier has."""

BATCH = 100


def statements() -> dict[str, tuple[str, bool, bool]]:
    """name -> (statement, its notify parameter, a jobs_notify statement of its own after the insert
    committed): the shipped statements, with the NOTIFY in the insert's transaction, after it, and none."""
    single, many = sql.query("job_insert"), sql.query("job_insert_many")
    return {
        "single, NOTIFY": (single, True, False),
        "single, NOTIFY after commit": (single, False, True),
        "single, no NOTIFY": (single, False, False),
        "batch 100, NOTIFY": (many, True, False),
        "batch 100, NOTIFY after commit": (many, False, True),
        "batch 100, no NOTIFY": (many, False, False),
    }


def params(batch: bool, notify: bool) -> dict[str, Any]:
    common = {"actor": "bench.notify", "queue": "default", "priority": 0, "tags": [], "max_attempts": 3,
              "scheduled_at": None, "schedule_to_close": None, "parent_id": None, "notify": notify,
              "idempotent": True, "concurrency_key": None, "trace_context": None}
    if batch:
        return common | {"ids": [uuid.uuid4() for _ in range(BATCH)], "payloads": ["{}"] * BATCH}
    return common | {"id": uuid.uuid4(), "payload": "{}"}


def produce(dsn: str, name: str, start_at: float, seconds: float, out: Any, stop: Any) -> None:
    """One producer: commits as fast as it can for `seconds` from `start_at`, puts its job count, and keeps
    its connection (whose server process the CPU accounting reads) until `stop`."""
    if name.startswith("sync client"):
        produce_with_sync_client(dsn, name, start_at, seconds, out)
        stop.wait(60)
        return
    if name in CLIENT_MODES:
        asyncio.run(produce_with_client(dsn, name, start_at, seconds, out))
        stop.wait(60)
        return
    (statement, notify, after), batch = statements()[name], "batch" in name
    notify_after = sql.query("jobs_notify")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(3):  # warm: prepared, planned
            conn.execute(statement, params(batch, notify))  # type: ignore[arg-type, unused-ignore]
            conn.execute(notify_after, {"queue": "warm"})  # type: ignore[arg-type, unused-ignore]
        while time.time() < start_at:
            time.sleep(0.001)
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            conn.execute(statement, params(batch, notify))  # type: ignore[arg-type, unused-ignore]
            if after:
                conn.execute(notify_after, {"queue": "default"})  # type: ignore[arg-type, unused-ignore]
            jobs += BATCH if batch else 1
        out.put(jobs)
        stop.wait(60)


def setup_notifier(notifier: Any, mode: str) -> None:
    if mode.endswith("no NOTIFY"):  # the floor: no insert notifies, and none is sent after
        notifier.inline = lambda queue: False
        notifier.quiet = lambda queue: False  # (an older taskq has no quiet: harmless)
        notifier.send_now = lambda queue: False  # (an older taskq has no send_now: harmless)
        notifier.after_commit = lambda queue: None
    elif mode.endswith("in the insert"):
        if hasattr(notifier, "in_transaction"):
            notifier.in_transaction = True
        else:  # an older taskq: window 0 made every insert notify inline
            notifier.window = 0.0


async def produce_with_client(dsn: str, mode: str, start_at: float, seconds: float, out: Any) -> None:
    # two connections: the NOTIFY sent after a commit takes one while the producer may hold the other
    async with await JobsClient.connect(dsn, min_size=2, max_size=2) as client:
        setup_notifier(client.backend.notifier, mode)
        for i in range(3):
            await client.enqueue("bench.notify", i)
        await asyncio.sleep(max(0.0, start_at - time.time()))  # every producer starts at once
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            await client.enqueue("bench.notify", jobs)
            jobs += 1
        out.put(jobs)


def produce_with_sync_client(dsn: str, mode: str, start_at: float, seconds: float, out: Any) -> None:
    with SyncJobsClient.connect(dsn, min_size=2, max_size=2) as client:
        setup_notifier(client.backend.notifier, mode)
        for i in range(3):
            client.enqueue("bench.notify", i)
        time.sleep(max(0.0, start_at - time.time()))
        jobs, end = 0, start_at + seconds
        while time.time() < end:
            client.enqueue("bench.notify", jobs)
            jobs += 1
        out.put(jobs)


async def light_load_delay(dsn: str, rate: float, seconds: float) -> dict[str, Any]:
    """One client enqueueing `rate` jobs a second (far enough apart that coalescing never delays one)
    and a LISTEN connection in the same process: ms from the enqueue call, and from its return (the
    commit is done), to the job's notification arriving. What sending the NOTIFY after the commit could
    add at light load, without a worker's claim in the figure."""
    arrived: list[float] = []
    listener = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await listener.execute("LISTEN taskq_jobs")

    async def listen() -> None:
        async for _ in listener.notifies():
            arrived.append(time.perf_counter())

    task = asyncio.get_running_loop().create_task(listen())
    calls: list[tuple[float, float]] = []
    try:
        async with await JobsClient.connect(dsn, min_size=2, max_size=2) as client:
            for i in range(5):
                await client.enqueue("bench.notify", i)
            await asyncio.sleep(0.5)
            arrived.clear()
            start, n = time.perf_counter(), int(rate * seconds)
            for i in range(n):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                before = time.perf_counter()
                await client.enqueue("bench.notify", i)
                calls.append((before, time.perf_counter()))
            await asyncio.sleep(0.5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await listener.close()
    # pair each call with the first notification after it (one per job at this rate)
    from_call, from_return, j = [], [], 0
    for before, after in calls:
        while j < len(arrived) and arrived[j] < before:
            j += 1
        if j < len(arrived):
            from_call.append(1000 * (arrived[j] - before))
            from_return.append(1000 * (arrived[j] - after))
    return {"jobs": len(calls), "notifications": len(arrived),
            "from_call_ms": {"p50": percentile(from_call, 50), "p99": percentile(from_call, 99)},
            "from_return_ms": {"p50": percentile(from_return, 50), "p99": percentile(from_return, 99)}}


class Watch:
    """During a turn: the notifications delivered on the jobs channel (one per notifying commit and
    queue: PostgreSQL folds duplicates only within one transaction), and what the producers' backends
    were doing, sampled from pg_stat_activity every `every` seconds (`Lock:object` is the notify
    lock; `IO:WalSync` / `LWLock:WALWrite` the commit flush; `idle` is time spent in the client)."""

    def __init__(self, dsn: str, every: float = 0.005) -> None:
        self.dsn, self.every = dsn, every
        self.notifications = 0
        self.waits: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self.window = (float("inf"), float("inf"))  # [start, end) of the measured turn, set by _turn
        self._stop = threading.Event()
        self._ready = threading.Barrier(3)
        self._threads = [threading.Thread(target=self._listen, daemon=True),
                         threading.Thread(target=self._sample, daemon=True)]

    def __enter__(self) -> Watch:
        for t in self._threads:
            t.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)

    def _listen(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("LISTEN taskq_jobs")
            self._ready.wait(10)
            while not self._stop.is_set():
                for _ in conn.notifies(timeout=0.1):
                    if self.window[0] <= time.time() < self.window[1]:
                        self.notifications += 1

    def _sample(self) -> None:
        query = """SELECT CASE WHEN state <> 'active' THEN state
                               ELSE coalesce(wait_event_type || ':' || wait_event, 'on CPU') END, count(*)
                   FROM pg_stat_activity
                   WHERE datname = current_database() AND backend_type = 'client backend'
                     AND pid <> pg_backend_pid() AND query NOT LIKE 'LISTEN%%' GROUP BY 1"""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            self._ready.wait(10)
            while not self._stop.is_set():
                rows = conn.execute(query).fetchall()
                if not self.window[0] <= time.time() < self.window[1]:
                    time.sleep(self.every)
                    continue
                self.samples += 1
                for what, n in rows:
                    self.waits[str(what)] += int(n)
                time.sleep(self.every)

    def shares(self) -> dict[str, float]:
        total = sum(self.waits.values())
        return {k: v / total for k, v in self.waits.most_common()} if total else {}


def turn(dsn: str, name: str, producers: int, seconds: float, server: ServerCpu) -> dict[str, Any]:
    reset_jobs(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")  # the previous turn's dirty pages are not flushed during this one
    with Watch(dsn) as watch:
        result = _turn(dsn, name, producers, seconds, server, watch)
    return result | {"notifications": watch.notifications, "notifications_per_s": watch.notifications / seconds,
                     "producer_states": watch.shares(), "samples": watch.samples}


def _turn(dsn: str, name: str, producers: int, seconds: float, server: ServerCpu, watch: Watch) -> dict[str, Any]:
    ctx = multiprocessing.get_context("fork")
    out, stop = ctx.Queue(), ctx.Event()
    start_at = time.time() + 1.5
    watch.window = (start_at, start_at + seconds)
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
    parser.add_argument("--light-seconds", type=float, default=10.0,
                        help="seconds of the light-load leg (50 jobs/s, enqueue -> notification); 0: skip it")
    parser.add_argument("--only", default=None,
                        help="comma-separated substrings: run only the modes whose name contains one")
    args = parser.parse_args()
    modes = [*statements(), *CLIENT_MODES]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        modes = [m for m in modes if any(w in m for w in wanted)]
    run_params = {"producers": args.producers, "seconds": args.seconds, "rounds": args.rounds,
                  "taskq": str(Path(taskq.__file__).resolve().parent)}
    info = machine()
    with bench_database(args.dsn, "notify") as dsn:
        facts = server_facts(dsn)
        announce("notify", run_params, info, facts)
        server = ServerCpu(dsn)
        results: dict[str, list[dict[str, Any]]] = {}
        try:
            for r in range(args.rounds):
                for name in modes:
                    result = turn(dsn, name, args.producers, args.seconds, server)
                    results.setdefault(name, []).append(result)
                    shown = ", ".join(f"{k} {v:.0%}" for k, v in list(result["producer_states"].items())[:4])
                    print(f"round {r + 1}: {name}: {result['jobs_per_s']:,.0f} jobs/s, "
                          f"{result['notifications_per_s']:,.0f} notifying commits/s; producers: {shown}",
                          flush=True)
            light = asyncio.run(light_load_delay(dsn, 50.0, args.light_seconds)) if args.light_seconds else None
        finally:
            server.close()
    summary: dict[str, dict[str, Any]] = {}
    for name, runs in results.items():
        states: collections.Counter[str] = collections.Counter()
        for x in runs:
            states.update(x["producer_states"])
        summary[name] = {"jobs_per_s": statistics.median(x["jobs_per_s"] for x in runs),
                         "server_us_per_job": statistics.median(x["server_us_per_job"] or 0.0 for x in runs),
                         "notifications_per_s": statistics.median(x["notifications_per_s"] for x in runs),
                         "producer_states": {k: v / len(runs) for k, v in states.most_common()},
                         "rounds": runs}
    rows = []
    for name, s_ in summary.items():
        floor_name = f"{name.split(',')[0]}, no NOTIFY"
        floor = summary.get(floor_name)
        cost = f"{1 - s_['jobs_per_s'] / floor['jobs_per_s']:+.1%}" if floor and floor is not s_ else ""
        top = ", ".join(f"{k} {v:.0%}" for k, v in list(s_["producer_states"].items())[:3])
        rows.append([name, s_["jobs_per_s"], s_["server_us_per_job"], cost, s_["notifications_per_s"], top])
    print()
    print(f"{args.producers} producers, medians of {args.rounds} rounds of {args.seconds:g} s")
    print_table(["enqueue", "jobs/s", "PG µs/job", "NOTIFY costs", "notifying commits/s",
                 "producer backends (sampled)"], rows)
    print("(NOTIFY costs: jobs/s lost against the same path with no NOTIFY; producer backends: share of "
          "samples idle (in the client) or active, by wait event)")
    if light:
        print(f"\nlight load, 50 jobs/s, {light['jobs']} jobs, {light['notifications']} notifications:")
        print_table(["ms", "p50", "p99"],
                     [["enqueue call → its notification", light["from_call_ms"]["p50"], light["from_call_ms"]["p99"]],
                      ["enqueue returned → its notification", light["from_return_ms"]["p50"],
                       light["from_return_ms"]["p99"]]])
    report = header("notify", run_params, info, facts) | {"results": summary, "light_load": light}
    print(f"\nwrote {write_report('notify', report, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
