"""Out of the box: workers started exactly as the README says (`taskq worker APP`, no settings), side by
side with an older taskq checkout and with PgQueuer at its defaults, on the same server in one run.

    python benchmarks/defaults.py [--dsn DSN] [--jobs 50000] [--rounds 3] [--workers 1,2]
                                  [--systems taskq,baseline,pgqueuer,awa] [--cases defaults,wide]
                                  [--baseline-root DIR] [--baseline-venv DIR] [--pgqueuer-venv DIR] [--awa-venv DIR]
                                  [--checkout NAME=ROOT:VENV ...]
                                  [--memory] [--latency-rounds 3] [--json out.json]

Systems (each in a database of its own on the one server; its own virtualenv and working directory):
- `taskq`: this checkout, `<this venv>/bin/taskq worker benchmarks.apps:actors`;
- `baseline`: another checkout (`--baseline-root`, with `--baseline-venv`), started the same way:
  the before of a before/after comparison;
- any `--checkout NAME=ROOT:VENV`: one more checkout, as `baseline` (several, for a bisect in one run);
- `pgqueuer`: PgQueuer in its own virtualenv (`--pgqueuer-venv`; `pip install pgqueuer asyncpg`),
  `benchmarks/pgqueuer_app.py worker`: one asyncpg connection, every option at its default.
- `awa`: awa-pg in its own virtualenv (`--awa-venv`; `pip install awa-pg pydantic`), `benchmarks/awa_app.py
  worker N`: its canonical storage, N handlers per process (awa has no default: the case's `concurrency`,
  so 200 at `defaults` and 500 at `wide`, as taskq's; `concurrency=N` for another).

Cases: `defaults` (no settings at all: what a user gets) and, for taskq and awa, `wide` (`--concurrency 500
--claim-batch-size 200`, the setting of throughput.py), and for this checkout `keys` (the defaults, with the
backlog spread over 1,000 fairness keys of equal weight: docs/fairness.md). Every (system, case, worker
count) runs once per round, the order rotated from round to round so that a burst of noise does not land on one of them;
medians over the rounds are reported, with max/min of jobs/s (steadiness).

One run of a variant: the backlog (`--jobs` no-op jobs, all due) is written straight into the table
before any worker starts, the workers start together, and the drain is timed from the rows
(taskq: max(finished_at) - min(started_at); PgQueuer: its log, last `successful` - first `picked`).
CPU (from /proc) is counted between the first poll that saw a finished job and the one that saw them
all, per job finished in between: `py µs/job` is the worker processes', `PG µs/job` the server's
(the backends of that database plus the shared background processes, less this script's own two
backends). `commits/job` and, for taskq, the mean claim and finish batch sizes come from the server.

`--memory`: each taskq system's worker, started with `--concurrency 1000`, holds 1,000 sleeping jobs;
RSS idle and with them held. `--latency-rounds N`: each taskq system's own `benchmarks/latency.py`
(enqueue -> start at 50 jobs/s, default worker settings), run alternately N times; medians of p50/p99.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    DSN_HELP,
    REPO_ROOT,
    RESULTS_DIR,
    ServerCpu,
    as_url,
    checkout_spec,
    cpu_seconds,
    header,
    machine,
    print_table,
    server_facts,
    stop_workers,
    system_cpu,
    write_report,
)
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from taskq.dsn import resolve_dsn

APP = "benchmarks.apps:actors"
POLL_INTERVAL = 0.1
WIDE = {"concurrency": 500, "claim_batch_size": 200}
TASKQ_CONCURRENCY = 200
"""A taskq worker's concurrency without settings (the handlers awa gets at `defaults`)."""
MEMORY_JOBS = 1_000

TASKQ_RESET_SQL = "TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers, taskq.lease_losses"
TASKQ_FILL_SQL = """
INSERT INTO taskq.jobs (id, actor, payload)
SELECT uuidv7(), 'bench.noop', to_jsonb(g) FROM generate_series(1, %(jobs)s) AS g
"""
# case `keys`: the same backlog with KEYS fairness keys of equal weight, enqueued in turn, tagged as producers
# tag them (sql/0016_fair_claims.sql: a key's i-th job at base + i); the queue is fair
KEYS = 1000
TASKQ_KEYED_FILL_SQL = """
WITH fair AS (INSERT INTO taskq.fair_queues (queue) VALUES ('default') ON CONFLICT DO NOTHING)
INSERT INTO taskq.jobs (id, actor, payload, fairness_key, fair_tag)
SELECT uuidv7(), 'bench.noop', to_jsonb(g), 'tenant-' || (g %% %(keys)s), 1000.0 + g / %(keys)s
FROM generate_series(1, %(jobs)s) AS g
"""
TASKQ_DONE_SQL = "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'"
TASKQ_DRAIN_SQL = "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM taskq.jobs"
TASKQ_BATCHES_SQL = """
SELECT count(*), count(DISTINCT (worker_id, started_at)), count(DISTINCT (worker_id, finished_at)),
       count(*) FILTER (WHERE outcome <> 'succeeded' OR attempt <> 1)
FROM taskq.job_attempts
"""
AWA_RESET_SQL = "TRUNCATE awa.jobs_hot"
AWA_DONE_SQL = "SELECT count(*) FROM awa.jobs_hot WHERE state = 'completed'"
AWA_DRAIN_SQL = "SELECT extract(epoch FROM max(finalized_at) - min(attempted_at)) FROM awa.jobs_hot"
PGQ_RESET_SQL = "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics"
PGQ_DONE_SQL = "SELECT %(jobs)s - count(*) FROM pgqueuer"
PGQ_DRAIN_SQL = """
SELECT extract(epoch FROM max(created) FILTER (WHERE status = 'successful')
                         - min(created) FILTER (WHERE status = 'picked'))
FROM pgqueuer_log
"""
DONE_SQL = {"taskq": TASKQ_DONE_SQL, "pgqueuer": PGQ_DONE_SQL, "awa": AWA_DONE_SQL}
"""Jobs finished so far, by system kind."""
DRAIN_SQL = {"taskq": TASKQ_DRAIN_SQL, "pgqueuer": PGQ_DRAIN_SQL, "awa": AWA_DRAIN_SQL}
"""The drain's seconds from the rows, by system kind: the first start to the last finish."""
COMMITS_SQL = "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
WAL_SQL = "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
"""WAL written so far, in bytes (the whole server's: nothing else runs during a drain but autovacuum)."""


@dataclass
class System:
    name: str
    kind: str  # "taskq", "pgqueuer" or "awa"
    root: Path
    venv: Path
    dsn: str = ""
    own_backends: set[int] = field(default_factory=set)

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    def worker_command(self, settings: dict[str, Any]) -> list[str]:
        if self.kind == "pgqueuer":
            return [self.python, str(REPO_ROOT / "benchmarks" / "pgqueuer_app.py"), "worker"]
        if self.kind == "awa":
            return [self.python, str(REPO_ROOT / "benchmarks" / "awa_app.py"), "worker",
                    str(settings.get("concurrency", TASKQ_CONCURRENCY))]
        args = [str(self.venv / "bin" / "taskq"), "worker", APP]
        for name, value in settings.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        return args

    def env(self) -> dict[str, str]:
        return os.environ | {"TASKQ_DSN": self.dsn, "PGDSN": as_url(self.dsn)}


def case_settings(case: str) -> dict[str, Any]:
    """`defaults` and `keys` -> no settings; `wide` -> WIDE; anything else is `field=value+field=value` (flags)."""
    if case in ("defaults", "keys"):
        return {}
    if case == "wide":
        return dict(WIDE)
    return dict(pair.split("=", 1) for pair in case.split("+"))


# -- databases ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_database(admin: str, prefix: str) -> Iterator[str]:
    name = f"taskq_bench_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    try:
        yield make_conninfo(admin, dbname=name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def install(system: System) -> None:
    """The system's own schema, installed by its own code."""
    if system.kind in ("pgqueuer", "awa"):
        cmd = [system.python, str(REPO_ROOT / "benchmarks" / f"{system.kind}_app.py"), "install"]
    else:
        cmd = [str(system.venv / "bin" / "taskq"), "migrate"]
    subprocess.run(cmd, cwd=system.root, env=system.env(), check=True, capture_output=True)


def fill(system: System, jobs: int, *, keyed: bool = False) -> None:
    with psycopg.connect(system.dsn, autocommit=True) as conn:
        if system.kind == "pgqueuer":
            conn.execute(PGQ_RESET_SQL)
            subprocess.run([system.python, str(REPO_ROOT / "benchmarks" / "pgqueuer_app.py"), "enqueue",
                            str(jobs)], cwd=REPO_ROOT, env=system.env(), check=True)
            conn.execute("VACUUM ANALYZE pgqueuer")
        elif system.kind == "awa":
            conn.execute(AWA_RESET_SQL)
            subprocess.run([system.python, str(REPO_ROOT / "benchmarks" / "awa_app.py"), "enqueue", str(jobs)],
                           cwd=REPO_ROOT, env=system.env(), check=True)
            conn.execute("VACUUM ANALYZE awa.jobs_hot")
        else:
            conn.execute(TASKQ_RESET_SQL)
            if keyed:
                conn.execute(TASKQ_KEYED_FILL_SQL, {"jobs": jobs, "keys": KEYS})
            else:
                conn.execute(TASKQ_FILL_SQL, {"jobs": jobs})
            conn.execute("VACUUM ANALYZE taskq.jobs")
        conn.execute("CHECKPOINT")


# -- one drain -----------------------------------------------------------------------------------------


@dataclass
class Snap:
    at: float
    done: int
    workers: float
    server: dict[int, float]
    busy: float
    total: float


def snap(conn: psycopg.Connection[Any], system: System, server: ServerCpu, pids: list[int], jobs: int) -> Snap:
    row = conn.execute(DONE_SQL[system.kind], {"jobs": jobs}).fetchone()
    busy, total = system_cpu()
    return Snap(
        at=time.perf_counter(), done=int(row[0]) if row else 0,
        workers=sum(cpu_seconds(pid, children=True) or 0.0 for pid in pids),
        server={pid: cpu for pid, cpu in server.ours().items() if pid not in system.own_backends},
        busy=busy, total=total,
    )


def drain(system: System, case: str, workers: int, jobs: int, timeout: float, tag: str) -> dict[str, Any]:
    fill(system, jobs, keyed=case == "keys")
    settings = case_settings(case)
    logs = RESULTS_DIR / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server = ServerCpu(system.dsn)
    with psycopg.connect(system.dsn, autocommit=True) as conn:
        own = conn.execute("SELECT pg_backend_pid()").fetchone()
        own_server = server._conn.execute("SELECT pg_backend_pid()").fetchone()
        system.own_backends = {int(own[0]) if own else -1, int(own_server[0]) if own_server else -1}
        (commits_before,) = conn.execute(COMMITS_SQL).fetchone() or (0,)
        (wal_before,) = conn.execute(WAL_SQL).fetchone() or (0,)
        procs = []
        for i in range(workers):
            with open(logs / f"defaults-{tag}-w{i}.log", "wb") as log_file:
                procs.append(subprocess.Popen(system.worker_command(settings), cwd=system.root, env=system.env(),
                                              stdout=log_file, stderr=subprocess.STDOUT))
        pids = [p.pid for p in procs]
        polls = 0
        first: Snap | None = None
        last: Snap | None = None
        deadline = time.monotonic() + timeout
        try:
            while True:
                s = snap(conn, system, server, pids, jobs)
                polls += 1
                if first is None and s.done > 0:
                    first = s
                if s.done >= jobs:
                    last = s
                    break
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError(f"a worker exited early; see {logs}/defaults-{tag}-*.log")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{jobs - s.done} jobs unfinished after {timeout:.0f}s ({tag})")
                time.sleep(POLL_INTERVAL)
        finally:
            codes = stop_workers(procs)
            server.close()
        conn.execute("SELECT pg_stat_clear_snapshot()")
        (commits_after,) = conn.execute(COMMITS_SQL).fetchone() or (0,)
        (wal_after,) = conn.execute(WAL_SQL).fetchone() or (0,)
        row = conn.execute(DRAIN_SQL[system.kind]).fetchone()
        drain_s = float(row[0]) if row and row[0] is not None else float("nan")
        result: dict[str, Any] = {"system": system.name, "case": case, "workers": workers, "jobs": jobs,
                                  "exit_codes": codes, "drain_s": drain_s, "jobs_per_s": jobs / drain_s}
        if system.kind == "taskq":
            attempts, claims, finishes, odd = conn.execute(TASKQ_BATCHES_SQL).fetchone() or (0, 0, 0, 0)
            result |= {"attempt_rows": attempts, "odd_attempts": odd,
                       "claim_batch": attempts / claims if claims else None,
                       "finish_batch": attempts / finishes if finishes else None}
    assert first is not None and last is not None
    window = last.at - first.at
    window_jobs = max(1, last.done - first.done)
    server_s = sum(cpu - first.server.get(pid, 0.0) for pid, cpu in last.server.items())
    # this script's own statements are commits too: two per poll, a few around the drain
    result |= {
        "window_s": window,
        "py_us_per_job": 1e6 * (last.workers - first.workers) / window_jobs,
        "pg_us_per_job": 1e6 * server_s / window_jobs,
        "py_cores": (last.workers - first.workers) / window if window else None,
        "pg_cores": server_s / window if window else None,
        "machine_busy": (last.busy - first.busy) / (last.total - first.total) if last.total > first.total else None,
        "commits_per_job": max(0, int(commits_after) - int(commits_before) - 2 * polls - 3) / jobs,
        "wal_bytes_per_job": (int(wal_after) - int(wal_before)) / jobs,
    }
    return result


# -- memory and latency ----------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def memory(system: System, timeout: float = 60.0) -> dict[str, Any]:
    """RSS of one worker idle, then holding MEMORY_JOBS sleeping jobs (`--concurrency 1000`)."""
    with psycopg.connect(system.dsn, autocommit=True) as conn:
        conn.execute(TASKQ_RESET_SQL)
        log_path = RESULTS_DIR / "logs" / f"defaults-memory-{system.name}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(system.worker_command({"concurrency": MEMORY_JOBS}), cwd=system.root,
                                    env=system.env(), stdout=log_file, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while not (conn.execute("SELECT count(*) FROM taskq.workers").fetchone() or (0,))[0]:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"the worker did not start; see {log_path}")
                time.sleep(0.1)
            time.sleep(1.0)  # let the first claims and heartbeat settle before reading the idle size
            idle = rss_kb(proc.pid)
            conn.execute("INSERT INTO taskq.jobs (id, actor, payload) SELECT uuidv7(), 'bench.sleep', '600'"
                         " FROM generate_series(1, %s)", (MEMORY_JOBS,))
            conn.execute("SELECT pg_notify('taskq_jobs', 'default')")
            while (conn.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'running'").fetchone()
                   or (0,))[0] < MEMORY_JOBS:
                if time.monotonic() > deadline:
                    raise RuntimeError("the worker did not take every job in time")
                time.sleep(0.1)
            time.sleep(0.5)
            held = rss_kb(proc.pid)
        finally:
            proc.send_signal(signal.SIGTERM)
            stop_workers([proc])
    return {"system": system.name, "idle_kb": idle, "held_kb": held,
            "per_job_kb": (held - idle) / MEMORY_JOBS}


def latency(system: System, admin: str, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "latency.json"
        subprocess.run([system.python, "benchmarks/latency.py", "--dsn", admin, "--seconds", str(seconds),
                        "--json", str(out)], cwd=system.root, check=True, capture_output=True)
        report = json.loads(out.read_text())
    res = report["results"]
    return {"system": system.name, "p50_ms": res["enqueue_to_start_ms"]["p50"],
            "p99_ms": res["enqueue_to_start_ms"]["p99"], "loadavg": report["machine"]["loadavg"]}


# -- the run --------------------------------------------------------------------------------------------


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float:
        values = [r[key] for r in results if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")

    rates = [r["jobs_per_s"] for r in results]
    return {"jobs_per_s": med("jobs_per_s"), "rounds": rates, "max_over_min": max(rates) / min(rates),
            "pg_us_per_job": med("pg_us_per_job"), "py_us_per_job": med("py_us_per_job"),
            "pg_cores": med("pg_cores"), "py_cores": med("py_cores"), "machine_busy": med("machine_busy"),
            "commits_per_job": med("commits_per_job"), "wal_bytes_per_job": med("wal_bytes_per_job"),
            "claim_batch": med("claim_batch"),
            "finish_batch": med("finish_batch")}


def paired(results: list[dict[str, Any]], first: str) -> dict[str, Any]:
    """Each system against `first`, round by round (the drains of one round ran minutes apart at most, so a VM
    whose speed drifts between rounds moves both): per case and worker count, the median, lowest and highest
    of the rounds' ratios of jobs/s and of CPU per job (PostgreSQL + workers)."""
    by = {(r["system"], r["case"], r["workers"], r["round"]): r for r in results}
    out: dict[str, Any] = {}
    for (name, case, workers, _), _r in sorted(by.items()):
        key = f"{name}/{case}/{workers}"
        if name == first or key in out:
            continue
        rate, cpu = [], []
        for (n, c, w, rnd), mine in sorted(by.items()):
            theirs = by.get((first, case, workers, rnd))
            if (n, c, w) != (name, case, workers) or theirs is None:
                continue
            rate.append(mine["jobs_per_s"] / theirs["jobs_per_s"])
            cpu.append((mine["pg_us_per_job"] + mine["py_us_per_job"])
                       / (theirs["pg_us_per_job"] + theirs["py_us_per_job"]))
        if rate:
            out[key] = {"against": first, "rounds": len(rate), "rate_ratio_median": statistics.median(rate),
                        "rate_ratios": rate, "cpu_ratio_median": statistics.median(cpu), "cpu_ratios": cpu}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=50_000, help="backlog per drain")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are reported")
    parser.add_argument("--workers", default="1,2", help="worker process counts, e.g. 1,2")
    parser.add_argument("--systems", default="taskq,baseline,pgqueuer")
    parser.add_argument("--cases", default="defaults,wide",
                        help="defaults (no settings), wide (taskq only), or field=value+field=value (taskq only)")
    parser.add_argument("--baseline-root", type=Path, default=Path("/work/wt-perf-baseline"))
    parser.add_argument("--baseline-venv", type=Path, default=Path("/work/venv-perf-baseline"))
    parser.add_argument("--pgqueuer-venv", type=Path, default=Path("/work/venv-pgqueuer"))
    parser.add_argument("--awa-venv", type=Path, default=Path("/work/venv-awa"))
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=ROOT:VENV",
                        help="one more taskq checkout, named NAME in --systems (repeatable; for a bisect)")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up on a drain after this long")
    parser.add_argument("--memory", action="store_true", help="RSS with 1,000 jobs held, per taskq system")
    parser.add_argument("--latency-rounds", type=int, default=0, help="latency.py runs per taskq system")
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "defaults.json")
    args = parser.parse_args()
    admin = resolve_dsn(args.dsn)
    known = {
        "taskq": System("taskq", "taskq", REPO_ROOT, Path(sys.executable).parent.parent),
        "baseline": System("baseline", "taskq", args.baseline_root, args.baseline_venv),
        "pgqueuer": System("pgqueuer", "pgqueuer", REPO_ROOT, args.pgqueuer_venv),
        "awa": System("awa", "awa", REPO_ROOT, args.awa_venv),
    }
    for spec in args.checkout:
        parsed = checkout_spec(spec)
        if parsed is None or parsed[0] in known:
            parser.error(f"--checkout {spec!r}: expected a new NAME=ROOT:VENV")
        name, root, venv = parsed
        known[name] = System(name, "taskq", root, venv)
    unknown = [name for name in args.systems.split(",") if name not in known]
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    systems = [known[name] for name in args.systems.split(",")]
    counts = [int(w) for w in args.workers.split(",")]
    # `keys` needs fair share (migration 16): this checkout only
    variants = [(s, case, w) for case in args.cases.split(",") for s in systems for w in counts
                if case == "defaults" or (s.kind == "taskq" and (case != "keys" or s.name == "taskq"))
                or (s.kind == "awa" and case != "keys")]
    info = machine()
    params = vars(args) | {"json": str(args.json)}
    print(f"defaults: load average {info['loadavg']} on {info['cpus']} CPUs at the start", file=sys.stderr)
    results: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        for s in systems:
            s.dsn = stack.enter_context(scratch_database(admin, s.name))
            install(s)
        server_info = server_facts(systems[0].dsn)
        for r in range(args.rounds):
            shift = r % len(variants)
            for s, case, w in variants[shift:] + variants[:shift]:
                res = drain(s, case, w, args.jobs, args.timeout, f"{s.name}-{case}-{w}w-r{r + 1}")
                res["round"] = r + 1
                results.append(res)
                print(f"  round {r + 1}: {s.name} {case} {w}w: {res['jobs_per_s']:,.0f} jobs/s, PG "
                      f"{res['pg_us_per_job']:.0f} µs/job, py {res['py_us_per_job']:.0f} µs/job, machine busy "
                      f"{100 * (res['machine_busy'] or 0):.0f}%, load {os.getloadavg()[0]:.2f}", file=sys.stderr)
        mem = [memory(s) for s in systems if s.kind == "taskq"] if args.memory else []
        lat: list[dict[str, Any]] = []
        for _ in range(args.latency_rounds):
            for s in systems:
                if s.kind == "taskq":
                    lat.append(latency(s, admin, args.latency_seconds))
                    print(f"  latency {s.name}: p50 {lat[-1]['p50_ms']:.2f} ms, p99 {lat[-1]['p99_ms']:.2f} ms",
                          file=sys.stderr)
    summary = {f"{s.name}/{case}/{w}": summarize([x for x in results if (x["system"], x["case"], x["workers"])
                                                  == (s.name, case, w)]) for s, case, w in variants}
    after = machine()
    print(f"\ndefaults: {args.jobs:,} no-op jobs per drain, {args.rounds} rounds; load average "
          f"{info['loadavg']} at the start, {after['loadavg']} at the end, {info['cpus']} CPUs")
    print_table(
        ["system", "case", "workers", "jobs/s", "rounds", "max/min", "PG µs/job", "py µs/job", "PG cores",
         "py cores", "machine busy", "commits/job", "WAL B/job", "claim batch", "finish batch"],
        [[key.split("/")[0], key.split("/")[1], int(key.split("/")[2]), v["jobs_per_s"],
          " / ".join(f"{x:,.0f}" for x in v["rounds"]), v["max_over_min"], v["pg_us_per_job"], v["py_us_per_job"],
          v["pg_cores"], v["py_cores"], f"{100 * v['machine_busy']:.0f}%", v["commits_per_job"],
          v["wal_bytes_per_job"], v["claim_batch"], v["finish_batch"]] for key, v in summary.items()],
    )
    pairs = paired(results, systems[0].name)
    if pairs:
        print(f"\npaired with {systems[0].name}, round by round (ratios: the system's / {systems[0].name}'s)")
        print_table(["system", "case", "workers", "rounds", "jobs/s ratio, median", "lowest", "highest",
                     "CPU/job ratio, median", "lowest", "highest"],
                    [[*key.split("/"), v["rounds"],
                      *(f"{x:.3f}" for x in (v["rate_ratio_median"], min(v["rate_ratios"]), max(v["rate_ratios"]),
                                             v["cpu_ratio_median"], min(v["cpu_ratios"]), max(v["cpu_ratios"])))]
                     for key, v in pairs.items()])
    if mem:
        print()
        print_table(["system", "RSS idle KiB", f"RSS with {MEMORY_JOBS:,} held KiB", "KiB per held job"],
                    [[m["system"], m["idle_kb"], m["held_kb"], m["per_job_kb"]] for m in mem])
    lat_summary: dict[str, Any] = {}
    if lat:
        for s in systems:
            mine = [x for x in lat if x["system"] == s.name]
            if mine:
                lat_summary[s.name] = {"p50_ms": statistics.median(x["p50_ms"] for x in mine),
                                       "p99_ms": statistics.median(x["p99_ms"] for x in mine),
                                       "runs": [(x["p50_ms"], x["p99_ms"]) for x in mine]}
        print()
        print_table(["system", "enqueue->start p50 ms", "p99 ms", "runs (p50 / p99)"],
                    [[name, v["p50_ms"], v["p99_ms"], ", ".join(f"{a:.2f}/{b:.2f}" for a, b in v["runs"])]
                     for name, v in lat_summary.items()])
    odd = [x for x in results if x.get("odd_attempts") or (x.get("attempt_rows") not in (None, x["jobs"]))]
    if odd:
        print(f"WARNING: bookkeeping off in {len(odd)} drains: {[(x['system'], x['round']) for x in odd]}")
    report = header("defaults", params, info, server_info) | {
        "machine_after": after, "summary": summary, "paired": pairs, "drains": results, "memory": mem,
        "latency": lat, "latency_summary": lat_summary,
    }
    print(f"wrote {write_report('defaults', report, args.json)}")


if __name__ == "__main__":
    main()
