"""Backlog drain: no-op async jobs per second with 1 and 2 worker processes.

    python benchmarks/throughput.py [--dsn DSN] [--jobs 50000] [--workers 1,2] [--rounds 3]
                                    [--concurrency 500] [--claim-batch-size 200] [--py-spy]
                                    [--app benchmarks.apps:actors] [--json out.json]

Each round empties the tables, enqueues the whole backlog with `enqueue_many` (every job is
`pending` before any worker exists), then starts the worker processes
(`python -m taskq.worker benchmarks.apps:actors ...`, all at once) and waits until every job has
succeeded. The figure is jobs / (max(finished_at) - min(started_at)) from the rows themselves; it is
cross-checked by polling the status counts. Full bookkeeping is on: one job_attempts row and two
state_change events per job, every write fenced.

Where the time goes, per job and over the drain window: CPU of each worker process and of the
PostgreSQL server (from /proc), how busy the whole machine was, commits (pg_stat_database
xact_commit), WAL flushes (pg_stat_io), and the claim / finish batch sizes actually achieved
(grouped from job_attempts timestamps, which are each statement's now()). `--py-spy` records the
first worker with py-spy and prints its hottest functions.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
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
    reset_jobs,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)
from apps import NOOP, registry

from taskq.client import JobsClient

APP = "benchmarks.apps:actors"
POLL_INTERVAL = 0.25
TARGET_TWO_WORKERS = 13_000.0

COUNTS_SQL = """
SELECT count(*) FILTER (WHERE status = 'succeeded'),
       count(*) FILTER (WHERE status = 'running'),
       count(*) FILTER (WHERE status NOT IN ('pending', 'scheduled', 'running', 'succeeded')),
       (SELECT count(*) FROM taskq.workers)
FROM taskq.jobs
"""
DB_COUNTERS_SQL = """
SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()),
       (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal'),
       pg_current_wal_lsn() - '0/0'::pg_lsn,
       (SELECT coalesce(sum(autovacuum_count + autoanalyze_count), 0) FROM pg_stat_user_tables
        WHERE schemaname = 'taskq')
"""


def db_counters(conn: psycopg.Connection[Any]) -> dict[str, float]:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(DB_COUNTERS_SQL).fetchone()
    assert row is not None
    return {"commits": float(row[0]), "wal_fsyncs": float(row[1]), "wal_bytes": float(row[2]),
            "autovacuums": float(row[3])}


async def enqueue_backlog(dsn: str, jobs: int, batch: int) -> float:
    """Write `jobs` pending no-op jobs; returns the enqueue rate (jobs/s)."""
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        started = time.perf_counter()
        for first in range(0, jobs, batch):
            await client.enqueue_many(NOOP, list(range(first, min(first + batch, jobs))))
        return jobs / (time.perf_counter() - started)
    finally:
        await client.close()


def start_profiler(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    exe = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if exe is None:
        print("py-spy not found (pip install py-spy); running without the profile", file=sys.stderr)
        return None
    try:
        return subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "--nonblocking",
             "--duration", str(max(1, int(seconds))), "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        print(f"py-spy failed to start ({exc}); running without the profile", file=sys.stderr)
        return None


def _short_frame(frame: str) -> str:
    """'fn (/long/path/module.py:12)' -> 'fn (module.py:12)'."""
    name, sep, where = frame.partition(" (")
    return f"{name} ({where.rsplit('/', 1)[-1]}" if sep else frame


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample share per function from py-spy's collapsed stacks."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [_short_frame(f) for f in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return {
        "samples": total,
        "self": [(f, n / total) for f, n in own.most_common(top)] if total else [],
        "inclusive": [(f, n / total) for f, n in inclusive.most_common(top)] if total else [],
    }


def run_round(
    dsn: str, args: argparse.Namespace, workers: int, server: ServerCpu, tag: str
) -> dict[str, Any]:
    reset_jobs(dsn)
    enqueue_rate = asyncio.run(enqueue_backlog(dsn, args.jobs, args.enqueue_batch))
    after_enqueue = getattr(args, "after_enqueue", None)  # benchmarks/otel.py: a trace context on each job
    if after_enqueue is not None:
        after_enqueue(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE taskq.jobs")
        before = db_counters(conn)
        settings = {"concurrency": args.concurrency, "claim_batch_size": args.claim_batch_size}
        logs = RESULTS_DIR / "logs"
        procs = [spawn_worker(dsn, args.app, settings, logs / f"throughput-{tag}-w{i}.log",
                              getattr(args, "python", None)) for i in range(workers)]
        pids = [p.pid for p in procs]
        polls: list[tuple[float, int, int]] = []
        first: Any = None
        last: Any = None
        profiler = None
        deadline = time.monotonic() + args.timeout
        try:
            while True:
                snap = cpu_snapshot(pids, server)
                row = conn.execute(COUNTS_SQL).fetchone()
                assert row is not None
                done, running, other, registered = (int(v) for v in row)
                polls.append((snap.at, done, running))
                if first is None and done + running > 0:
                    first = (snap, done, before_first_poll_done(polls))
                if args.py_spy and profiler is None and first is not None and registered == workers:
                    # until the worker exits (after the drain); idle samples are not recorded
                    out = RESULTS_DIR / f"throughput-{tag}.pyspy.txt"
                    profiler = start_profiler(pids[0], out, args.timeout)
                if done + other >= args.jobs:
                    last = (snap, done)
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{args.jobs - done} jobs still unfinished after {args.timeout:.0f}s")
                time.sleep(POLL_INTERVAL)
        finally:
            codes = stop_workers(procs)
            if profiler is not None:
                profiler.wait(30)
        after = db_counters(conn)
        result = collect(conn, args.jobs, workers)
    poll_count = len(polls) * 2 + 4  # this script's own commits in the window (counts + snapshots)
    commits = after["commits"] - before["commits"] - poll_count
    assert first is not None and last is not None
    cpu = cpu_between(first[0], last[0])
    window_jobs = last[1] - first[2]
    result.update({
        "workers": workers,
        "enqueue_jobs_per_s": enqueue_rate,
        "exit_codes": codes,
        "poll_jobs_per_s": poll_rate(polls, args.jobs),
        "commits": commits,
        "commits_per_job": commits / args.jobs,
        "wal_fsyncs": after["wal_fsyncs"] - before["wal_fsyncs"],
        "wal_bytes_per_job": (after["wal_bytes"] - before["wal_bytes"]) / args.jobs,
        "autovacuum_runs": after["autovacuums"] - before["autovacuums"],
        "cpu": cpu,
        "cpu_window_jobs": window_jobs,
        "worker_cpu_us_per_job": 1e6 * sum(cpu["processes_s"].values()) / max(1, window_jobs),
        "server_cpu_us_per_job": 1e6 * (cpu["server_s"] or 0.0) / max(1, window_jobs),
        "worker_cores": sum(cpu["processes_s"].values()) / cpu["wall_s"],
        "server_cores": (cpu["server_s"] or 0.0) / cpu["wall_s"],
        "server_all_cores": (cpu["server_all_s"] or 0.0) / cpu["wall_s"],
    })
    result["wal_fsyncs_per_s"] = result["wal_fsyncs"] / result["drain_s"] if result["drain_s"] else None
    if args.py_spy and (RESULTS_DIR / f"throughput-{tag}.pyspy.txt").exists():
        result["profile"] = summarize_profile(RESULTS_DIR / f"throughput-{tag}.pyspy.txt")
    return result


def before_first_poll_done(polls: list[tuple[float, int, int]]) -> int:
    """Jobs already finished at the poll before the first one that saw activity (0 in a fresh round)."""
    return polls[-2][1] if len(polls) >= 2 else 0


def poll_rate(polls: list[tuple[float, int, int]], jobs: int) -> float | None:
    """The drain rate seen by polling: from the last poll with nothing finished to the first with all."""
    start = next((i for i, p in enumerate(polls) if p[1] > 0), None)
    end = next((i for i, p in enumerate(polls) if p[1] >= jobs), None)
    if start is None or end is None or end <= start:
        return None
    t0, d0, _ = polls[max(0, start - 1)]
    t1, d1, _ = polls[end]
    return (d1 - d0) / (t1 - t0)


def collect(conn: psycopg.Connection[Any], jobs: int, workers: int) -> dict[str, Any]:
    """Everything measured from the rows: the drain time, per-worker spans, bookkeeping, batch sizes."""
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE attempt <> 1),"
        " extract(epoch FROM max(finished_at) - min(started_at)) FROM taskq.jobs"
    ).fetchone()
    assert row is not None
    succeeded, reattempted, drain = int(row[0]), int(row[1]), float(row[2])
    spans = conn.execute(
        "SELECT worker_id, count(*), extract(epoch FROM min(started_at)),"
        " extract(epoch FROM max(finished_at)), count(DISTINCT started_at), count(DISTINCT finished_at)"
        " FROM taskq.job_attempts GROUP BY worker_id ORDER BY worker_id"
    ).fetchall()
    attempts = sum(int(s[1]) for s in spans)
    claims = sum(int(s[4]) for s in spans)
    finishes = sum(int(s[5]) for s in spans)
    (events,) = conn.execute(
        "SELECT count(*) FROM taskq.job_events WHERE kind = 'state_change'"
    ).fetchone() or (0,)
    overlap = None
    if workers > 1 and len(spans) == workers:
        lo = max(float(s[2]) for s in spans)
        hi = min(float(s[3]) for s in spans)
        if hi > lo:
            (inside,) = conn.execute(
                "SELECT count(*) FROM taskq.jobs"
                " WHERE finished_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
                (lo, hi),
            ).fetchone() or (0,)
            overlap = {"seconds": hi - lo, "jobs_per_s": int(inside) / (hi - lo)}
    return {
        "jobs": jobs,
        "succeeded": succeeded,
        "reattempted": reattempted,
        "stale_writes": jobs - succeeded,
        "drain_s": drain,
        "jobs_per_s": jobs / drain if drain else None,
        "all_workers_busy": overlap,
        "start_skew_s": max(float(s[2]) for s in spans) - min(float(s[2]) for s in spans) if spans else None,
        "per_worker": [{"jobs": int(s[1]), "busy_s": float(s[3]) - float(s[2])} for s in spans],
        "attempt_rows": attempts,
        "state_change_events": int(events),
        "claim_statements": claims,
        "finish_statements": finishes,
        "mean_claim_batch": attempts / claims if claims else None,
        "mean_finish_batch": attempts / finishes if finishes else None,
    }


def summarize(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        values = [r[key] for r in rounds if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    overlap = [r["all_workers_busy"]["jobs_per_s"] for r in rounds if r.get("all_workers_busy")]
    return {
        "jobs_per_s": med("jobs_per_s"),
        "rounds_jobs_per_s": [r["jobs_per_s"] for r in rounds],
        "poll_jobs_per_s": med("poll_jobs_per_s"),
        "all_workers_busy_jobs_per_s": statistics.median(overlap) if overlap else None,
        "worker_cpu_us_per_job": med("worker_cpu_us_per_job"),
        "server_cpu_us_per_job": med("server_cpu_us_per_job"),
        "worker_cores": med("worker_cores"),
        "server_cores": med("server_cores"),
        "server_all_cores": med("server_all_cores"),
        "machine_busy_fraction": statistics.median(
            r["cpu"]["machine_busy_fraction"] for r in rounds if r["cpu"]["machine_busy_fraction"] is not None
        ),
        "commits_per_job": med("commits_per_job"),
        "wal_fsyncs_per_s": med("wal_fsyncs_per_s"),
        "mean_claim_batch": med("mean_claim_batch"),
        "mean_finish_batch": med("mean_finish_batch"),
        "start_skew_s": med("start_skew_s"),
    }


def print_results(summary: dict[int, dict[str, Any]], rounds: dict[int, list[dict[str, Any]]]) -> None:
    print_table(
        ["workers", "jobs/s", "rounds", "polled", "all busy", "worker µs/job", "PG µs/job", "worker cores",
         "PG cores", "PG all DBs", "machine busy", "commits/job", "fsyncs/s", "claim batch", "finish batch"],
        [
            [w, s["jobs_per_s"], " / ".join(f"{x:,.0f}" for x in s["rounds_jobs_per_s"]),
             s["poll_jobs_per_s"],
             s["all_workers_busy_jobs_per_s"] or float("nan"),
             s["worker_cpu_us_per_job"], s["server_cpu_us_per_job"], s["worker_cores"], s["server_cores"],
             s["server_all_cores"],
             f"{100 * s['machine_busy_fraction']:.0f}%",
             s["commits_per_job"], s["wal_fsyncs_per_s"], s["mean_claim_batch"], s["mean_finish_batch"]]
            for w, s in summary.items()
        ],
    )
    for w, rs in rounds.items():
        bad = [r for r in rs if r["stale_writes"] or r["reattempted"] or r["attempt_rows"] != r["jobs"]
               or r["state_change_events"] != 2 * r["jobs"]]
        if bad:
            print(f"WARNING ({w} workers): bookkeeping off in {len(bad)} rounds: "
                  f"{[(r['succeeded'], r['attempt_rows'], r['state_change_events']) for r in bad]}")
        for r in rs:
            if "profile" in r:
                print(f"\npy-spy, worker 0 of {w} ({r['profile']['samples']} samples), self time:")
                for frame, share in r["profile"]["self"][:15]:
                    print(f"  {100 * share:5.1f}%  {frame}")
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=50_000, help="backlog size per round")
    parser.add_argument("--workers", default="1,2", help="worker process counts to measure, e.g. 1,2")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--concurrency", type=int, default=500, help="worker --concurrency")
    parser.add_argument("--claim-batch-size", type=int, default=200, help="worker --claim-batch-size")
    parser.add_argument("--enqueue-batch", type=int, default=5_000, help="jobs per enqueue_many call")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on a round after this long")
    parser.add_argument("--py-spy", action="store_true", help="profile each round's first worker with py-spy")
    parser.add_argument("--app", default=APP, help=f"APP the workers run; it must define {NOOP!r} ({APP})")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "throughput.json")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    params = {"jobs": args.jobs, "workers": counts, "rounds": args.rounds, "concurrency": args.concurrency,
              "claim_batch_size": args.claim_batch_size, "enqueue_batch": args.enqueue_batch,
              "poll_interval": "default (1 s)", "app": args.app, "actor": NOOP}
    info = machine()

    rounds: dict[int, list[dict[str, Any]]] = {w: [] for w in counts}
    with bench_database(args.dsn, "throughput") as dsn:
        server_info = server_facts(dsn)
        announce("throughput", params, info, server_info)
        server = ServerCpu(dsn)
        try:
            for r in range(args.rounds):
                for w in counts:
                    result = run_round(dsn, args, w, server, f"{w}w-r{r + 1}")
                    rounds[w].append(result)
                    busy = 100 * (result["cpu"]["machine_busy_fraction"] or 0)
                    print(f"  round {r + 1}/{args.rounds}, {w} worker(s): {result['jobs_per_s']:,.0f} jobs/s "
                          f"(polled {result['poll_jobs_per_s'] or 0:,.0f}), worker "
                          f"{result['worker_cpu_us_per_job']:.0f} µs/job, PG "
                          f"{result['server_cpu_us_per_job']:.0f} µs/job, machine busy {busy:.0f}%",
                          file=sys.stderr)
        finally:
            server.close()
    summary = {w: summarize(rs) for w, rs in rounds.items()}
    report = header("throughput", params, info, server_info) | {
        "machine_after": machine(),
        "summary": {str(w): s for w, s in summary.items()},
        "rounds": {str(w): rs for w, rs in rounds.items()},
        "target": {"two_workers_jobs_per_s": TARGET_TWO_WORKERS,
                   "met": 2 in summary and summary[2]["jobs_per_s"] >= TARGET_TWO_WORKERS},
    }
    print(f"\nthroughput: {args.jobs:,} no-op jobs per round, concurrency {args.concurrency}, claim batch "
          f"{args.claim_batch_size}, load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_results(summary, rounds)
    if 2 in summary:
        met = "met" if report["target"]["met"] else "MISSED"
        print(f"target: {TARGET_TWO_WORKERS:,.0f} jobs/s with 2 workers: {met}")
    print(f"wrote {write_report('throughput', report, args.json)}")


if __name__ == "__main__":
    main()
