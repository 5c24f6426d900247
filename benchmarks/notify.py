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
import collections
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
    if name in CLIENT_MODES:
        asyncio.run(produce_with_client(dsn, CLIENT_MODES[name], start_at, seconds, out))
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
    parser.add_argument("--only", default=None,
                        help="comma-separated substrings: run only the modes whose name contains one")
    args = parser.parse_args()
    modes = [*statements(), *CLIENT_MODES]
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        modes = [m for m in modes if any(w in m for w in wanted)]
    run_params = {"producers": args.producers, "seconds": args.seconds, "rounds": args.rounds}
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
                    states = ", ".join(f"{k} {v:.0%}" for k, v in list(result["producer_states"].items())[:4])
                    print(f"round {r + 1}: {name}: {result['jobs_per_s']:,.0f} jobs/s, "
                          f"{result['notifications_per_s']:,.0f} notifying commits/s; producers: {states}",
                          flush=True)
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
        floor_name = "client, no NOTIFY" if name in CLIENT_MODES else f"{name.split(',')[0]}, no NOTIFY"
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
    report = header("notify", run_params, info, facts) | {"results": summary}
    print(f"\nwrote {write_report('notify', report, args.json)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
