"""The scheduler under load: 1,000 schedules every 10 s on 2 worker processes.

    python benchmarks/schedules.py [--dsn DSN] [--schedules 1000] [--every 10] [--workers 2]
                                   [--slots 4] [--rounds 2] [--json out.json]

Three kinds of round, interleaved (--rounds of each), each with --workers fresh `taskq worker`
processes on a fresh set of tables:

- idle: the workers declare no schedule (the scheduler still polls the empty table): the baseline;
- schedules: the workers declare --schedules schedules of a no-op actor, every --every seconds, in a
  queue these workers do not read: their CPU above the baseline is the scheduler's;
- schedules+run: the same, and the workers also run the slot jobs (lateness to the start of the job).

After the workers registered and one slot boundary passed (the declarations are upserted at start), CPU
is measured over --slots slot periods from /proc (each worker, and the PostgreSQL server). Slot
lateness: "made" is when a slot job became visible (committed) past its nominal time, dated by a probe
that polls the jobs table every 20 ms (a tick's jobs share their created_at, the tick transaction's
start; the probe notes when each created_at first appears); "started" is started_at - scheduled_for
when the workers also run the slot jobs. Target: p99 lateness under 1 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
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
    percentile,
    print_table,
    server_facts,
    spawn_worker,
    stop_workers,
    write_report,
)

TARGET_P99_S = 1.0
MODES = ("idle", "schedules", "schedules+run")
SLOT_QUEUE = "bench-slots"


def reset(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers, taskq.schedules")
        conn.execute("VACUUM ANALYZE taskq.jobs")


def db_now(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()
    assert row is not None
    return float(row[0])


def wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"gave up waiting for {what}")
        time.sleep(0.05)


class VisibilityProbe:
    """Polls the jobs table every `interval` seconds from its own connection and notes when each tick's
    jobs became visible to others (committed): a tick's jobs share their created_at (its transaction's
    start), so the first poll that sees a created_at dates the commit of that tick, within `interval`."""

    def __init__(self, dsn: str, interval: float = 0.02) -> None:
        self.dsn = dsn
        self.interval = interval
        self.first_seen: dict[Any, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="visibility-probe", daemon=True)

    def __enter__(self) -> VisibilityProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                rows = conn.execute(
                    "SELECT extract(epoch FROM clock_timestamp())::float8, created_at FROM taskq.jobs"
                    " WHERE schedule IS NOT NULL AND created_at > now() - interval '30 seconds'"
                    " GROUP BY created_at"
                ).fetchall()
                for seen_at, created_at in rows:
                    self.first_seen.setdefault(created_at, seen_at)
                self._stop.wait(self.interval)


def run_round(dsn: str, args: argparse.Namespace, mode: str, server: ServerCpu, tag: str) -> dict[str, Any]:
    reset(dsn)
    app = "benchmarks.schedule_apps:idle" if mode == "idle" else "benchmarks.schedule_apps:app"
    queues = f"default,{SLOT_QUEUE}" if mode == "schedules+run" else "default"
    settings = {"queues": queues, "concurrency": 200, "claim_batch_size": 100}
    env_settings = {"TASKQ_BENCH_SCHEDULES": str(args.schedules), "TASKQ_BENCH_EVERY": str(args.every),
                    "TASKQ_BENCH_SLOT_QUEUE": SLOT_QUEUE}
    saved = {k: os.environ.get(k) for k in env_settings}
    os.environ.update(env_settings)
    logs = RESULTS_DIR / "logs"
    try:
        procs = [spawn_worker(dsn, app, settings, logs / f"schedules-{tag}-w{i}.log") for i in range(args.workers)]
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            def registered() -> bool:
                for p in procs:
                    if p.poll() is not None:
                        raise SystemExit(f"a worker exited with {p.returncode}; see {logs}")
                row = conn.execute("SELECT count(*) FROM taskq.workers").fetchone()
                return row is not None and row[0] == args.workers

            wait(registered, 60, "the workers to register")
            expected = 0 if mode == "idle" else args.schedules
            wait(lambda: (conn.execute("SELECT count(*) FROM taskq.schedules").fetchone() or [0])[0] == expected,
                 60, "the declarations")
            # start measuring just after a slot boundary, once the start-up work is over
            now = db_now(conn)
            start_boundary = (now // args.every + 1) * args.every
            time.sleep(max(0.0, start_boundary - now + 0.5))
            with VisibilityProbe(dsn) as probe:
                start = cpu_snapshot([p.pid for p in procs], server)
                end_boundary = start_boundary + args.slots * args.every
                time.sleep(max(0.0, end_boundary - db_now(conn) + 0.5 + (args.every / 2 if mode != "idle" else 0)))
                end = cpu_snapshot([p.pid for p in procs], server)
            rows = conn.execute(
                "SELECT extract(epoch FROM scheduled_for)::float8, created_at,"
                "       extract(epoch FROM started_at - scheduled_for)::float8"
                " FROM taskq.jobs WHERE schedule IS NOT NULL"
                "   AND scheduled_for > to_timestamp(%s) AND scheduled_for <= to_timestamp(%s)",
                (start_boundary, end_boundary),
            ).fetchall()
            dupes = conn.execute(
                "SELECT count(*) - count(DISTINCT (schedule, scheduled_for)) FROM taskq.jobs WHERE schedule IS NOT NULL"
            ).fetchone()
        finally:
            codes = stop_workers(procs)
    cpu = cpu_between(start, end)
    wall = cpu["wall_s"]
    per_worker = [v / wall for v in cpu["processes_s"].values()]
    # visible: committed, as the probe first saw its tick's jobs (within its 20 ms polling)
    inserted = [probe.first_seen[r[1]] - r[0] for r in rows if r[1] in probe.first_seen]
    unseen = sum(1 for r in rows if r[1] not in probe.first_seen)
    started = [r[2] for r in rows if r[2] is not None]
    expected_jobs = 0 if mode == "idle" else args.schedules * args.slots
    return {
        "mode": mode,
        "wall_s": wall,
        "worker_cpu_fraction": per_worker,
        "worker_cpu_fraction_mean": sum(per_worker) / len(per_worker),
        "server_cpu_fraction": (cpu["server_s"] or 0.0) / wall if cpu["server_s"] is not None else None,
        "machine_busy_fraction": cpu["machine_busy_fraction"],
        "slot_jobs": len(rows),
        "expected_slot_jobs": expected_jobs,
        "duplicate_slot_jobs": int(dupes[0]) if dupes else None,
        "slot_jobs_not_seen_by_probe": unseen,
        "insert_lateness_s": {"p50": percentile(inserted, 50), "p99": percentile(inserted, 99),
                              "max": max(inserted, default=float("nan"))},
        "start_lateness_s": {"p50": percentile(started, 50), "p99": percentile(started, 99),
                             "max": max(started, default=float("nan"))} if started else None,
        "exit_codes": codes,
    }


def median(values: list[float]) -> float:
    return percentile(values, 50)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--every", type=int, default=10, help="seconds between two slots of each schedule")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4, help="slot periods measured per round")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of each mode; medians reported")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "schedules.json")
    args = parser.parse_args()
    params = {"schedules": args.schedules, "every_s": args.every, "workers": args.workers, "slots": args.slots,
              "rounds": args.rounds, "schedule_poll_interval": "default (1 s)"}
    info = machine()
    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    with bench_database(args.dsn, "schedules") as dsn:
        server_info = server_facts(dsn)
        announce("schedules", params, info, server_info)
        server = ServerCpu(dsn)
        try:
            for r in range(args.rounds):
                for mode in MODES:
                    result = run_round(dsn, args, mode, server, f"{mode.replace('+', '-')}-r{r + 1}")
                    rounds[mode].append(result)
                    late = result["insert_lateness_s"]
                    print(f"  round {r + 1}/{args.rounds} {mode}: worker CPU "
                          f"{100 * result['worker_cpu_fraction_mean']:.2f}% of a core each, "
                          f"{result['slot_jobs']}/{result['expected_slot_jobs']} slot jobs, "
                          f"insert lateness p50 {late['p50']:.3f} s p99 {late['p99']:.3f} s", file=sys.stderr)
        finally:
            server.close()
    summary: dict[str, dict[str, Any]] = {}
    for mode, rs in rounds.items():
        summary[mode] = {
            "worker_cpu_pct": 100 * median([r["worker_cpu_fraction_mean"] for r in rs]),
            "server_cpu_pct": 100 * median([r["server_cpu_fraction"] or 0.0 for r in rs]),
            "slot_jobs": median([float(r["slot_jobs"]) for r in rs]),
            "expected": rs[0]["expected_slot_jobs"],
            "duplicates": sum(r["duplicate_slot_jobs"] or 0 for r in rs),
            "insert_p50_ms": 1000 * median([r["insert_lateness_s"]["p50"] for r in rs]),
            "insert_p99_ms": 1000 * median([r["insert_lateness_s"]["p99"] for r in rs]),
            "start_p50_ms": 1000 * median([r["start_lateness_s"]["p50"] for r in rs if r["start_lateness_s"]]),
            "start_p99_ms": 1000 * median([r["start_lateness_s"]["p99"] for r in rs if r["start_lateness_s"]]),
        }
    scheduler_cpu = summary["schedules"]["worker_cpu_pct"] - summary["idle"]["worker_cpu_pct"]
    worst_p99 = max(summary[m]["insert_p99_ms"] for m in ("schedules", "schedules+run")) / 1000
    report = header("schedules", params, info, server_info) | {
        "machine_after": machine(),
        "summary": summary,
        "scheduler_cpu_pct_per_worker": scheduler_cpu,
        "rounds": rounds,
        "target": {"p99_lateness_s": TARGET_P99_S, "met": worst_p99 < TARGET_P99_S},
    }
    print(f"\nschedules: {args.schedules:,} schedules every {args.every} s on {args.workers} workers, "
          f"{args.slots} slots measured per round, medians of {args.rounds} interleaved rounds; "
          f"load average at start {info['loadavg']} on {info['cpus']} CPUs")
    if report["load_warning"]:
        print(report["load_warning"])
    print_table(
        ("mode", "worker CPU % of a core", "PG CPU %", "slot jobs", "expected", "dup", "made p50 ms", "made p99 ms",
         "started p50 ms", "started p99 ms"),
        [(m, s["worker_cpu_pct"], s["server_cpu_pct"], s["slot_jobs"], s["expected"], s["duplicates"],
          s["insert_p50_ms"], s["insert_p99_ms"], s["start_p50_ms"], s["start_p99_ms"]) for m, s in summary.items()],
    )
    print(f"scheduler CPU per worker (schedules - idle): {scheduler_cpu:.2f}% of a core")
    met = "met" if report["target"]["met"] else "MISSED"
    print(f"target: p99 slot lateness under {TARGET_P99_S:.0f} s: {met} (worst p99 {worst_p99:.3f} s)")
    print(f"wrote {write_report('schedules', report, args.json)}")


if __name__ == "__main__":
    main()
