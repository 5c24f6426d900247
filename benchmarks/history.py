"""Does history slow the hot path? Drain and enqueue → start with 0 / 1M / 5M terminal jobs in the tables;
and a sustained run (enqueue and drain at a fixed rate for minutes).

    python benchmarks/history.py [--dsn DSN] [--levels 0,1000000,5000000] [--rounds 5] [--jobs 40000]
                                 [--workers 2] [--latency-seconds 10] [--no-freeze] [--no-quiesce]
                                 [--json out.json]
    python benchmarks/history.py --sustained 600 [--rate 5000] [--workers 2] [--dsn DSN]

History mode: one database per level, each seeded set-based (`_common.seed_history`: INSERT ... SELECT
generate_series) with that many succeeded jobs that finished in the last day (inside the default
retention windows, so no worker prunes them), each with its two state_change events and its attempts row,
then VACUUM (FREEZE, ANALYZE): a settled history, as vacuum leaves one over the days it takes to write
(with `--no-freeze`, VACUUM ANALYZE only: the history is then all-visible but not frozen, a debt that
some later vacuum pays; session 9's --no-freeze run saw none of it come due in its rounds). Nothing is
vacuumed by hand after that.
Each round visits every database in turn (the starting database rotates), so that the machine's noise
lands on every level alike:

1. drain: `--jobs` no-op jobs enqueued with `enqueue_many` and held (their queue paused), then `--workers`
   worker processes started; once all of them listen, the queue is resumed and they start on it together.
   jobs/s = jobs / (max(finished_at) - min(started_at)) of the round's own rows; CPU per job of the
   workers and of the PostgreSQL processes serving that database, from the release to the last job;
2. latency, once per round for all levels at once, after the round's drains: first `quiesce` waits until
   autovacuum has caught up with the drains' dead rows on every level and no vacuum runs on the server
   (`--no-quiesce`: start at once); then one idle worker per database, and jobs enqueued one per commit
   at `--rate` 50/s into each for `--latency-seconds`, one producer task per database with their
   schedules staggered (`latency.drive_many`): enqueue call → actor start (the actor returns
   time.time()). Measured side by side, the levels share whatever the machine does meanwhile (a
   checkpoint, a WAL flush stall, the placement of a new process); measured one after the other, as up
   to session 7, one leg's p50 moved by ±20 % from round to round at any level, as much as the
   criterion.

The drained rows stay: the "0" database holds at most rounds x jobs terminal rows by the end. After the
rounds: EXPLAIN (ANALYZE, BUFFERS) of the worker's claim (`job_claim`, 200 of a 1,000-job backlog) and
finish (`job_finish_batch` of those 200), inside a transaction rolled back, on every database; and per
table its size, live and dead tuples and autovacuum runs (pg_stat_user_tables). Target: every level's
drain and latency p50 within 10 % of the empty table's.

Sustained mode (`--sustained SECONDS`): a fresh database, `--workers` workers, and this process enqueueing
`--rate` jobs/s in `enqueue_many` batches every 0.1 s for SECONDS. Sampled every 10 s: jobs finished,
backlog, dead tuples of the three tables, autovacuum runs, checkpoints and the WAL written. At the end,
per minute: jobs finished, enqueue → start p50/p99 (created_at → started_at on the server); target: the last
minute's throughput within 10 % of the first's. If the backlog grows, the machine cannot drain that rate:
the drained rate is the ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    RESULTS_DIR,
    ServerCpu,
    announce,
    bench_database,
    cpu_between,
    cpu_snapshot,
    header,
    machine,
    print_table,
    seed_history,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from _vacuum import VacuumWatch, quiesce, settle, table_stats
from apps import NOOP, registry
from latency import drive_many, wait_for_listener

from taskq import sql
from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
QUEUE = "default"
HISTORY_ACTOR = "bench.history"
HISTORY_AGE = 3600.0
"""Seconds since the newest seeded job finished (5M at 10 ms apart reach 15 hours back: all inside the
default 1-day retention_succeeded)."""
MAX_SLOWDOWN = 0.10
POLL_INTERVAL = 0.25
SAMPLE_EVERY = 10.0
ENQUEUE_TICK = 0.1
EXPLAIN_BACKLOG = 1_000
EXPLAIN_LIMIT = 200

ROUND_SQL = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*),
       extract(epoch FROM max(finished_at) - min(started_at))
FROM taskq.jobs WHERE created_at >= %(t0)s
"""
BACKEND_TYPES_SQL = """
SELECT pid, CASE WHEN backend_type = 'client backend' THEN 'backends' ELSE backend_type END
FROM pg_stat_activity WHERE datname = current_database() OR backend_type NOT IN ('client backend', 'autovacuum worker')
"""
# two partial-index counts (jobs_claim_idx, jobs_running_lease_idx): one predicate over the three statuses
# would read the whole table, history included, at every poll
UNFINISHED_SQL = """
SELECT (SELECT count(*) FROM taskq.jobs WHERE status IN ('pending', 'scheduled'))
       + (SELECT count(*) FROM taskq.jobs WHERE status = 'running')
"""
SUSTAINED_SAMPLE_SQL = """
SELECT (SELECT count(*) FROM taskq.jobs WHERE status IN ('pending', 'scheduled')),
       (SELECT count(*) FROM taskq.jobs WHERE status = 'running'),
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'taskq'
        AND relname = 'jobs'),
       (SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables WHERE schemaname = 'taskq'),
       (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_user_tables WHERE schemaname = 'taskq'),
       (SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_user_tables WHERE schemaname = 'taskq'
        AND relname = 'jobs')
"""
CHECKPOINTS_SQL = {  # (timed + requested checkpoints so far, WAL bytes written so far)
    True: "SELECT num_timed + num_requested, pg_current_wal_lsn() - '0/0' FROM pg_stat_checkpointer",
    False: "SELECT checkpoints_timed + checkpoints_req, pg_current_wal_lsn() - '0/0' FROM pg_stat_bgwriter",
}
"""Keyed by PostgreSQL >= 17, where the checkpoint counters moved to pg_stat_checkpointer."""
PER_MINUTE_SQL = """
SELECT floor(extract(epoch FROM finished_at - %(t0)s) / 60)::int AS minute, count(*),
       1000 * percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at)),
       1000 * percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - created_at))
FROM taskq.jobs WHERE status = 'succeeded' AND finished_at >= %(t0)s
GROUP BY 1 ORDER BY 1
"""


def worker_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size}


async def enqueue_backlog(dsn: str, jobs: int, batch: int = 5_000, *, hold: bool = False) -> None:
    """`jobs` no-op jobs; with `hold`, their queue is then paused (`release` resumes it)."""
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        for first in range(0, jobs, batch):
            await client.enqueue_many(NOOP, list(range(first, min(first + batch, jobs))))
        if hold:
            await client.pause_queue(QUEUE, reason="history.py: held until every worker listens", by="bench")
    finally:
        await client.close()


async def release(dsn: str) -> None:
    """Resume the held queue: every waiting worker hears it by NOTIFY at the same moment."""
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        await client.resume_queue(QUEUE, by="bench")
    finally:
        await client.close()


# -- history mode ---------------------------------------------------------------------------------


def drain(dsn: str, args: argparse.Namespace, server: ServerCpu, tag: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        t0 = row[0]
        before = table_stats(conn)
        asyncio.run(enqueue_backlog(dsn, args.jobs, hold=True))
        logs = RESULTS_DIR / "logs"
        procs = [spawn_worker(dsn, APP, worker_settings(args), logs / f"history-{tag}-w{i}.log")
                 for i in range(args.workers)]
        pids = [p.pid for p in procs]
        deadline = time.monotonic() + args.timeout
        try:
            # The backlog waits behind a paused queue until every worker listens, so that all of them start
            # on it together: a worker's boot (0.3-0.6 s of imports) is not in the window, and the window
            # does not depend on which worker booted first.
            wait_for_listener(dsn, workers=args.workers)
            start = cpu_snapshot(pids, server)
            asyncio.run(release(dsn))
            while (left := int((conn.execute(UNFINISHED_SQL).fetchone() or (0,))[0])) > 0:
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{left} jobs unfinished after {args.timeout:.0f}s")
                time.sleep(POLL_INTERVAL)
            end = cpu_snapshot(pids, server)
            kinds = {int(r[0]): str(r[1]) for r in conn.execute(BACKEND_TYPES_SQL).fetchall()}
            after = table_stats(conn)
        finally:
            stop_workers(procs)
        done, total, drain_s = conn.execute(ROUND_SQL, {"t0": t0}).fetchone() or (0, 0, None)
    cpu = cpu_between(start, end)
    by_kind: dict[str, float] = {}
    for pid, seconds in end.server.items():
        kind = kinds.get(pid, "exited")
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds - start.server.get(pid, 0.0)
    return {
        "succeeded": int(done), "jobs": int(total), "drain_s": float(drain_s or 0),
        "jobs_per_s": int(done) / float(drain_s) if drain_s else None,
        # from the release of the backlog to its last job: the workers' boot is not in it
        "worker_cpu_us_per_job": 1e6 * sum(cpu["processes_s"].values()) / max(1, int(done)),
        "server_cpu_us_per_job": 1e6 * (cpu["server_s"] or 0.0) / max(1, int(done)),
        "machine_busy_fraction": cpu["machine_busy_fraction"],
        "server_cpu_us_per_job_by_kind": {k: 1e6 * v / max(1, int(done)) for k, v in sorted(by_kind.items())},
        "autovacuums": {t: after[t]["autovacuums"] - before[t]["autovacuums"] for t in after},
        "autovacuum_s": {t: None if after[t]["autovacuum_s"] is None
                         else after[t]["autovacuum_s"] - before[t]["autovacuum_s"] for t in after},
    }


def latency(dsns: list[str], args: argparse.Namespace, tag: str) -> list[dict[str, Any]]:
    """One idle worker per database, and `latency.drive_many` into all of them at once (a producer task each)."""
    procs = [spawn_worker(dsn, APP, {}, RESULTS_DIR / "logs" / f"history-{tag}-latency-{i}.log")
             for i, dsn in enumerate(dsns)]
    try:
        for dsn in dsns:
            wait_for_listener(dsn)
        return asyncio.run(drive_many(dsns, args.rate, args.latency_seconds))
    finally:
        stop_workers(procs)


def explain(dsn: str) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim of 200 jobs from a 1,000-job backlog and of their batched
    finish, in one transaction rolled back (the backlog too)."""
    asyncio.run(enqueue_backlog(dsn, EXPLAIN_BACKLOG))
    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as conn:
        claim = {"queues": ["default"], "limit": EXPLAIN_LIMIT, "worker_id": "bench-explain", "lock_timeout": 60.0}
        conn.execute("SET LOCAL taskq.worker_id = 'bench-explain'")
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.query("job_claim"), claim).fetchone()
        assert plan is not None
        out["claim"] = _plan_summary(plan[0])
        rows = conn.execute("SELECT id, attempt, claim_epoch FROM taskq.jobs WHERE status = 'running'"
                            " AND worker_id = 'bench-explain'").fetchall()
        # the claim above ran inside EXPLAIN: its rows are claimed, in this transaction
        n = len(rows)
        finish = {"worker_id": "bench-explain", "ids": [r[0] for r in rows], "attempts": [r[1] for r in rows],
                  "epochs": [r[2] for r in rows], "statuses": ["succeeded"] * n, "results": ["null"] * n,
                  "error_classes": [None] * n, "error_messages": [None] * n, "retry_delays": [0.0] * n,
                  "outcomes": ["succeeded"] * n, "details": [None] * n, "first_traces": [None] * n}
        plan = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql.query("job_finish_batch"),
                            finish).fetchone()
        assert plan is not None
        out["finish"] = _plan_summary(plan[0]) | {"rows": n}
        conn.rollback()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM taskq.jobs WHERE status = 'pending'")
    return out


def _plan_summary(doc: list[dict[str, Any]]) -> dict[str, Any]:
    top = doc[0]
    plan = top["Plan"]
    return {"execution_ms": top.get("Execution Time"), "planning_ms": top.get("Planning Time"),
            "shared_hit": plan.get("Shared Hit Blocks"), "shared_read": plan.get("Shared Read Blocks"),
            "shared_dirtied": plan.get("Shared Dirtied Blocks"), "plan": doc}


def history_mode(args: argparse.Namespace) -> None:
    levels = [int(v) for v in args.levels.split(",")]
    params = {"levels": levels, "rounds": args.rounds, "jobs": args.jobs, "workers": args.workers,
              "freeze": args.freeze, "quiesce": args.quiesce,
              "concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size,
              "latency_rate": args.rate, "latency_seconds": args.latency_seconds}
    info = machine()
    rounds: dict[int, list[dict[str, Any]]] = {n: [] for n in levels}
    seeded: dict[int, float] = {}
    finals: dict[int, dict[str, Any]] = {}
    seeded_tables: dict[int, dict[str, dict[str, Any]]] = {}
    seed_timings: dict[int, dict[str, float]] = {}
    vacuum = "VACUUM (FREEZE, ANALYZE)" if args.freeze else "VACUUM ANALYZE"
    with contextlib.ExitStack() as stack:
        dsns = {n: stack.enter_context(bench_database(args.dsn, f"history{n}")) for n in levels}
        server_info = server_facts(dsns[levels[0]])
        announce("history", params, info, server_info)
        for n in levels:
            if n:
                print(f"seeding {n:,} terminal jobs", file=sys.stderr)
                seed_timings[n] = {}
                seeded[n] = seed_history(dsns[n], n, actor=HISTORY_ACTOR, newest_age_s=HISTORY_AGE, progress=True,
                                         freeze=args.freeze, timings=seed_timings[n])
                print(f"\n  {seeded[n]:,.0f} jobs/s (with events, attempts, {vacuum}; the vacuum took "
                      f"{seed_timings[n]['vacuum_s']:.1f} s)", file=sys.stderr)
                settle(dsns[n])
        for n in levels:
            with psycopg.connect(dsns[n], autocommit=True) as conn:
                seeded_tables[n] = table_stats(conn)
        servers = {n: ServerCpu(dsns[n]) for n in levels}
        try:
            for r in range(args.rounds):
                order = levels[r % len(levels):] + levels[:r % len(levels)]
                drains: dict[int, dict[str, Any]] = {}
                for n in order:
                    load = machine()["loadavg"]
                    with VacuumWatch(dsns[n]) as drain_vacuums:
                        d = drains[n] = drain(dsns[n], args, servers[n], f"{n}-r{r + 1}")
                    d |= {"vacuum_samples": drain_vacuums.seen, "loadavg_before": load}
                    print(f"  round {r + 1}/{args.rounds}, {n:,} history: drain {d['jobs_per_s']:,.0f} jobs/s, "
                          f"PG {d['server_cpu_us_per_job']:.0f} µs/job "
                          f"({', '.join(f'{k} {v:.0f}' for k, v in d['server_cpu_us_per_job_by_kind'].items())}; "
                          f"autovacuums {d['autovacuums']}; vacuums during it (0.25 s samples): "
                          f"{d['vacuum_samples'] or 'none'})", file=sys.stderr)
                quiet = quiesce([dsns[n] for n in levels]) if args.quiesce else None
                load = machine()["loadavg"]
                with VacuumWatch(dsns[levels[0]]) as vacuums:
                    lats = latency([dsns[n] for n in levels], args, f"r{r + 1}")
                for n, lat in zip(levels, lats, strict=True):
                    lat |= {"vacuum_samples": vacuums.seen, "loadavg_before": load, "quiesce": quiet}
                    rounds[n].append({"loadavg_before": drains[n]["loadavg_before"], "drain": drains[n],
                                      "latency": lat})
                figures = "; ".join(f"{n:,}: {lat['enqueue_to_start_ms']['p50']:.2f} / "
                                    f"{lat['enqueue_to_start_ms']['p99']:.2f} ms"
                                    for n, lat in zip(levels, lats, strict=True))
                waited = "" if quiet is None else (f"after {quiet['waited_s']:.0f} s for the drains' vacuums"
                                                   f"{'' if quiet['settled'] else f' (not settled: {quiet})'}; ")
                print(f"  round {r + 1}/{args.rounds}, enqueue→start p50 / p99 (all levels at once): {figures} "
                      f"(load {load}; {waited}vacuums during it, 0.25 s samples: {vacuums.seen or 'none'})",
                      file=sys.stderr)
        finally:
            for cpu in servers.values():
                cpu.close()
        for n in levels:
            with psycopg.connect(dsns[n], autocommit=True) as conn:
                tables = table_stats(conn)
            finals[n] = {"explain": explain(dsns[n]), "tables": tables}
    summary = {n: summarize(rs) for n, rs in rounds.items()}
    base = summary[levels[0]]
    for s in summary.values():
        s["drain_vs_empty"] = s["jobs_per_s"] / base["jobs_per_s"] - 1
        s["latency_p50_vs_empty"] = s["latency_p50_ms"] / base["latency_p50_ms"] - 1
        s["met"] = s["drain_vs_empty"] >= -MAX_SLOWDOWN and s["latency_p50_vs_empty"] <= MAX_SLOWDOWN
    report = header("history", params, info, server_info) | {
        "machine_after": machine(), "seed_jobs_per_s": seeded, "seed_timings": seed_timings,
        "summary": {str(n): s for n, s in summary.items()},
        "rounds": {str(n): rs for n, rs in rounds.items()}, "final": {str(n): f for n, f in finals.items()},
        "tables_after_seed": {str(n): t for n, t in seeded_tables.items()},
    }
    print(f"\nhistory: {args.jobs:,} no-op jobs drained by {args.workers} workers, then {args.rate:g} jobs/s to one "
          f"idle worker, per level of terminal history; load average at start {info['loadavg']}, after "
          f"{report['machine_after']['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(
        ["terminal jobs", "drain jobs/s", "rounds", "vs empty", "PG µs/job", "backends µs/job", "worker µs/job",
         "p50 ms", "p99 ms",
         "p50 vs empty", "claim ms", "claim bufs", "finish ms", "finish bufs", "met"],
        [[f"{n:,}", s["jobs_per_s"], " / ".join(f"{x:,.0f}" for x in s["rounds_jobs_per_s"]),
          f"{100 * s['drain_vs_empty']:+.1f}%", s["server_cpu_us_per_job"], s["backends_cpu_us_per_job"],
          s["worker_cpu_us_per_job"],
          s["latency_p50_ms"], s["latency_p99_ms"], f"{100 * s['latency_p50_vs_empty']:+.1f}%",
          finals[n]["explain"]["claim"]["execution_ms"],
          (finals[n]["explain"]["claim"]["shared_hit"] or 0) + (finals[n]["explain"]["claim"]["shared_read"] or 0),
          finals[n]["explain"]["finish"]["execution_ms"],
          (finals[n]["explain"]["finish"]["shared_hit"] or 0) + (finals[n]["explain"]["finish"]["shared_read"] or 0),
          "yes" if s["met"] else "NO"]
         for n, s in summary.items()],
    )
    print("\ntables at the end (dead tuples, autovacuum runs since the database was made, seed included; "
          "autovacuum time during the rounds; sizes)")
    print_table(
        ["terminal jobs", "table", "live", "dead", "autovacuums", "autovacuum s in rounds", "total MB", "index MB"],
        [[f"{n:,}", t, v["live"], v["dead"], v["autovacuums"],
          "n/a" if v["autovacuum_s"] is None else v["autovacuum_s"] - seeded_tables[n][t]["autovacuum_s"],
          v["total_bytes"] / 2**20, v["index_bytes"] / 2**20]
         for n in levels for t, v in finals[n]["tables"].items()],
    )
    print(f"target: drain and enqueue→start p50 within {100 * MAX_SLOWDOWN:.0f} % of the empty table: "
          f"{'met' if all(s['met'] for s in summary.values()) else 'MISSED'}")
    print(f"wrote {write_report('history', report, args.json)}")


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(values: list[float]) -> float:
        return statistics.median(values)

    return {
        "jobs_per_s": med([r["drain"]["jobs_per_s"] for r in rounds]),
        "rounds_jobs_per_s": [r["drain"]["jobs_per_s"] for r in rounds],
        "server_cpu_us_per_job": med([r["drain"]["server_cpu_us_per_job"] for r in rounds]),
        "worker_cpu_us_per_job": med([r["drain"]["worker_cpu_us_per_job"] for r in rounds]),
        "backends_cpu_us_per_job": med([r["drain"]["server_cpu_us_per_job_by_kind"].get("backends", 0.0)
                                        for r in rounds]),
        "latency_p50_ms": med([r["latency"]["enqueue_to_start_ms"]["p50"] for r in rounds]),
        "latency_p99_ms": med([r["latency"]["enqueue_to_start_ms"]["p99"] for r in rounds]),
        "loadavg_before": [r["loadavg_before"][0] for r in rounds],
    }


# -- sustained mode -------------------------------------------------------------------------------


async def produce(dsn: str, rate: float, seconds: float) -> dict[str, Any]:
    """Enqueue `rate` jobs/s in batches every ENQUEUE_TICK for `seconds`; returns what was sent and how
    often the loop fell behind its schedule."""
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=2)
    per_tick = max(1, round(rate * ENQUEUE_TICK))
    ticks = int(seconds / ENQUEUE_TICK)
    late = 0
    sent = 0
    try:
        start = time.perf_counter()
        for i in range(ticks):
            delay = start + i * ENQUEUE_TICK - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                late += 1
            await client.enqueue_many(NOOP, [sent + k for k in range(per_tick)])
            sent += per_tick
        elapsed = time.perf_counter() - start
    finally:
        await client.close()
    return {"sent": sent, "late_ticks": late, "ticks": ticks, "enqueue_s": elapsed, "sent_per_s": sent / elapsed}


def sustained_mode(args: argparse.Namespace) -> None:
    params = {"seconds": args.sustained, "rate": args.rate, "workers": args.workers,
              "concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size,
              "enqueue": f"enqueue_many every {ENQUEUE_TICK} s"}
    info = machine()
    samples: list[dict[str, Any]] = []
    with bench_database(args.dsn, "sustained") as dsn:
        server_info = server_facts(dsn)
        announce("history --sustained", params, info, server_info)
        logs = RESULTS_DIR / "logs"
        procs = [spawn_worker(dsn, APP, worker_settings(args), logs / f"sustained-w{i}.log")
                 for i in range(args.workers)]
        try:
            wait_for_listener(dsn)
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT now()").fetchone()
                assert row is not None
                t0 = row[0]
                checkpoints = CHECKPOINTS_SQL[conn.info.server_version >= 170000]
                loop = asyncio.new_event_loop()
                producer = loop.run_in_executor(None, lambda: asyncio.run(produce(dsn, args.rate, args.sustained)))
                started = time.monotonic()
                while not producer.done():
                    loop.run_until_complete(asyncio.wait([producer], timeout=SAMPLE_EVERY))
                    conn.execute("SELECT pg_stat_clear_snapshot()")
                    s = conn.execute(SUSTAINED_SAMPLE_SQL).fetchone()
                    c = conn.execute(checkpoints).fetchone()
                    assert s is not None and c is not None
                    samples.append({"t": time.monotonic() - started, "backlog": int(s[0]), "running": int(s[1]),
                                    "jobs_dead": int(s[2]), "all_dead": int(s[3]), "autovacuums": int(s[4]),
                                    "jobs_autovacuums": int(s[5]), "checkpoints": int(c[0]), "wal_bytes": int(c[1]),
                                    "loadavg": machine()["loadavg"][0]})
                    print(f"  {samples[-1]}", file=sys.stderr)
                    if any(p.poll() is not None for p in procs):
                        raise RuntimeError(f"a worker exited early; see {logs}")
                sent = loop.run_until_complete(producer)
                loop.close()
                deadline = time.monotonic() + args.timeout
                while int((conn.execute(UNFINISHED_SQL).fetchone() or (0,))[0]) > 0 and time.monotonic() < deadline:
                    time.sleep(POLL_INTERVAL)
                minutes = [{"minute": int(r[0]), "jobs": int(r[1]), "start_p50_ms": float(r[2]),
                            "start_p99_ms": float(r[3])}
                           for r in conn.execute(PER_MINUTE_SQL, {"t0": t0}).fetchall()]
                tables = table_stats(conn)
        finally:
            stop_workers(procs)
    full = [m for m in minutes if m["minute"] < int(args.sustained // 60)]
    first, last = (full[0], full[-1]) if full else (None, None)
    change = last["jobs"] / first["jobs"] - 1 if first and last else None
    report = header("history-sustained", params, info, server_info) | {
        "machine_after": machine(), "producer": sent, "samples": samples, "minutes": minutes, "tables": tables,
        "last_vs_first_minute": change, "met": change is not None and abs(change) <= MAX_SLOWDOWN,
    }
    print(f"\nsustained: {args.rate:g} jobs/s asked for {args.sustained:g} s ({sent['sent_per_s']:,.0f}/s sent, "
          f"{sent['late_ticks']} of {sent['ticks']} ticks late), {args.workers} workers; load average at start "
          f"{info['loadavg']}, after {report['machine_after']['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(["minute", "jobs/s", "enqueue→start p50 ms", "p99 ms"],
                [[m["minute"] + 1, m["jobs"] / 60, m["start_p50_ms"], m["start_p99_ms"]] for m in minutes])
    print_table(["t s", "backlog", "running", "jobs dead tuples", "all dead tuples", "autovacuums (jobs)",
                 "checkpoints", "WAL MB/s", "load"],
                [[s["t"], s["backlog"], s["running"], s["jobs_dead"], s["all_dead"],
                  f"{s['autovacuums']} ({s['jobs_autovacuums']})", s["checkpoints"] - samples[0]["checkpoints"],
                  (s["wal_bytes"] - p["wal_bytes"]) / (s["t"] - p["t"]) / 2**20 if s is not p else None, s["loadavg"]]
                 for p, s in zip([samples[0], *samples], samples, strict=False)])
    print_table(["table", "live", "dead", "autovacuums", "total MB", "index MB"],
                [[t, v["live"], v["dead"], v["autovacuums"], v["total_bytes"] / 2**20, v["index_bytes"] / 2**20]
                 for t, v in tables.items()])
    if change is not None:
        print(f"last full minute vs first: {100 * change:+.1f} % (target within {100 * MAX_SLOWDOWN:.0f} %: "
              f"{'met' if report['met'] else 'MISSED'})")
    print(f"wrote {write_report('history-sustained', report, args.json)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--levels", default="0,1000000,5000000", help="terminal jobs per database; the first is "
                        "the reference")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each visits every level; medians")
    parser.add_argument("--jobs", type=int, default=40_000, help="backlog drained per visit")
    parser.add_argument("--workers", type=int, default=2, help="worker processes draining")
    parser.add_argument("--concurrency", type=int, default=500, help="worker --concurrency")
    parser.add_argument("--claim-batch-size", type=int, default=200, help="worker --claim-batch-size")
    parser.add_argument("--rate", type=float, default=None, help="jobs/s: latency (default 50) or sustained "
                        "(default 5000)")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="how long each latency leg enqueues")
    parser.add_argument("--sustained", type=float, default=None, metavar="SECONDS",
                        help="run the sustained mode for this long instead")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up on a drain after this long")
    parser.add_argument("--no-freeze", dest="freeze", action="store_false",
                        help="seed with VACUUM ANALYZE only: the history is left all-visible but not frozen")
    parser.add_argument("--no-quiesce", dest="quiesce", action="store_false",
                        help="start each latency leg right after the drains, while the vacuums they set off on "
                        "every level may still be running (by default it waits for them: `quiesce`)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.sustained:
        args.rate = args.rate or 5000.0
        args.json = args.json or RESULTS_DIR / "history-sustained.json"
        sustained_mode(args)
    else:
        args.rate = args.rate or 50.0
        args.json = args.json or RESULTS_DIR / "history.json"
        history_mode(args)


if __name__ == "__main__":
    main()
