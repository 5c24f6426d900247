"""Shared setup for the worker benchmarks: a fresh database per run, machine and server facts, CPU
accounting from /proc, worker subprocesses, percentiles, tables and the JSON report.

A benchmark creates its own database on the server (`--dsn`, else `TASKQ_DSN`, else the embedded
server), migrates it, and drops it at the end, so it needs CREATEDB rights.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from taskq.backend.migrations import migrate_dsn
from taskq.dsn import redact_dsn, resolve_dsn

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
DSN_HELP = "server to use (default: TASKQ_DSN, else the embedded one)"
BUSY_LOAD_PER_CPU = 0.5
"""A 1-minute load average above this many runnable tasks per CPU makes the figures suspect."""


# -- the machine ---------------------------------------------------------------------------------


def cpu_model() -> str | None:
    """The CPU's model name (/proc/cpuinfo), None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """CPU model and count, load averages now, and the Python and OS the benchmark runs on."""
    load1, load5, load15 = os.getloadavg()
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "loadavg": [round(load1, 2), round(load5, 2), round(load15, 2)],
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def load_warning(info: dict[str, Any]) -> str | None:
    load1 = info["loadavg"][0]
    cpus = info["cpus"] or 1
    if load1 > BUSY_LOAD_PER_CPU * cpus:
        return (f"WARNING: load average {load1:.2f} on {cpus} CPUs before the run: other work is competing "
                "for the CPU and these figures are pessimistic")
    return None


def announce(name: str, params: dict[str, Any], info: dict[str, Any], server: dict[str, Any]) -> None:
    """State the parameters and the machine load at the start (on stderr, like the progress lines)."""
    print(f"{name}: {json.dumps(params)}", file=sys.stderr)
    print(f"machine: {info['cpus']} CPUs, load average {info['loadavg']}, Python {info['python']}; "
          f"PostgreSQL {server['version']}, synchronous_commit={server['synchronous_commit']}",
          file=sys.stderr)
    warning = load_warning(info)
    if warning:
        print(warning, file=sys.stderr)


# -- the database --------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_database(dsn: str | None, prefix: str) -> Iterator[str]:
    """A freshly created and migrated database on the chosen server, dropped on exit. Enter it outside
    any event loop (the migration runs on its own)."""
    admin = resolve_dsn(dsn)
    name = f"taskq_bench_{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    bench_dsn = make_conninfo(admin, dbname=name)
    try:
        asyncio.run(migrate_dsn(bench_dsn))
        yield bench_dsn
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def server_facts(dsn: str) -> dict[str, Any]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        def show(setting: str) -> str:
            row = conn.execute(pgsql.SQL("SHOW {}").format(pgsql.Identifier(setting))).fetchone()
            return str(row[0]) if row else "?"

        return {
            "dsn": redact_dsn(dsn),
            "version": conn.info.server_version,
            "synchronous_commit": show("synchronous_commit"),
            "fsync": show("fsync"),
            "wal_sync_method": show("wal_sync_method"),
            "shared_buffers": show("shared_buffers"),
        }


def reset_jobs(dsn: str) -> None:
    """Empty every taskq table the worker writes, and give the planner fresh statistics."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.job_attempts, taskq.workers, taskq.job_dependencies")
        conn.execute("VACUUM ANALYZE taskq.jobs")


SEED_CHUNK = 100_000
SEED_SQL = """
WITH ins AS (
    INSERT INTO taskq.jobs (id, actor, status, attempt, claim_epoch, created_at, started_at, finished_at, result)
    SELECT uuidv7(-t.age), %(actor)s, 'succeeded', 1, 1, now() - t.age - interval '2 s',
           now() - t.age - interval '1 s', now() - t.age, 'null'::jsonb
    FROM generate_series(%(first)s::int, %(last)s::int) AS g,
         LATERAL (SELECT %(newest_age)s::float8 * interval '1 second' + (%(rows)s::int - g) * interval '10 ms')
             AS t(age)
    RETURNING id, started_at, finished_at
), ev AS (
    INSERT INTO taskq.job_events (job_id, at, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT id, started_at, 'state_change', 'pending', 'running', 1, 'bench', '{"claim_epoch": 1}'::jsonb FROM ins
    UNION ALL
    SELECT id, finished_at, 'state_change', 'running', 'succeeded', 1, 'bench', '{"claim_epoch": 1}'::jsonb
    FROM ins
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at, finished_at, outcome)
    SELECT id, 1, 1, 'bench', started_at, finished_at, 'succeeded' FROM ins
)
SELECT count(*) FROM ins
"""


def seed_history(dsn: str, rows: int, *, actor: str, newest_age_s: float, progress: bool = False,
                 freeze: bool = False, timings: dict[str, float] | None = None) -> float:
    """Write `rows` succeeded jobs, set-based (INSERT ... SELECT generate_series, not the client), each with
    its two state_change events and its attempts row as a real history has, then VACUUM ANALYZE the three
    tables. They finished 10 ms apart, the newest `newest_age_s` ago, in id order (time-ordered UUIDv7, as
    taskq's own ids: PostgreSQL 18). Returns jobs written per second.

    `freeze`: VACUUM (FREEZE, ANALYZE) instead, the state of a history that vacuum has gone over since it
    was written. A history written all at once and only VACUUMed is all-visible but not frozen, and
    some later vacuum of these tables must freeze it (PostgreSQL 18's eager scan of all-visible pages,
    or an aggressive vacuum), a cost that a history written over days pays a page at a time.
    `timings` gets "insert_s" and "vacuum_s"."""
    started = time.perf_counter()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for first in range(1, rows + 1, SEED_CHUNK):
            conn.execute(SEED_SQL, {"actor": actor, "first": first, "last": min(rows, first + SEED_CHUNK - 1),
                                    "rows": rows, "newest_age": newest_age_s})
            if progress:
                print(f"  seeded {min(rows, first + SEED_CHUNK - 1):,} / {rows:,}", file=sys.stderr, end="\r")
        inserted = time.perf_counter()
        vacuum = pgsql.SQL("VACUUM (FREEZE, ANALYZE) taskq.{}" if freeze else "VACUUM ANALYZE taskq.{}")
        for table in ("jobs", "job_events", "job_attempts"):
            conn.execute(vacuum.format(pgsql.Identifier(table)))
    done = time.perf_counter()
    if timings is not None:
        timings.update(insert_s=inserted - started, vacuum_s=done - inserted)
    return rows / (done - started)


# -- CPU accounting --------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces; it is wrapped in the first '(' and the last ')'
    return raw[raw.rindex(")") + 2:].split()


def cpu_seconds(pid: int, *, children: bool = False) -> float | None:
    """User + system CPU seconds of a live process (plus its reaped children's, if asked)."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    # fields[0] is the state (stat field 3): utime/stime/cutime/cstime are stat fields 14-17
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / CLOCK_TICKS


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def system_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    values = [int(v) for v in parts[:8]]
    idle = values[3] + values[4]  # idle + iowait
    total = sum(values)
    return (total - idle) / CLOCK_TICKS, total / CLOCK_TICKS


OUR_SERVER_PROCESSES_SQL = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() OR backend_type NOT IN ('client backend', 'autovacuum worker')
"""


class ServerCpu:
    """CPU seconds of the PostgreSQL server, read from /proc (unavailable when it runs elsewhere).

    `ours()` is per process: the backends connected to the benchmark's database (an autovacuum
    worker on it included) plus the shared background processes (WAL writer, checkpointer, I/O
    workers...); other databases on a shared server are left out. `everything()` is the postmaster,
    every live child and the children it already reaped (cutime/cstime): the server as a whole."""

    def __init__(self, dsn: str) -> None:
        self._conn = psycopg.connect(dsn, autocommit=True)
        row = self._conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        backend = int(row[0])
        self.postmaster = _parent_pid(backend) if _command(backend).startswith("postgres") else None

    def close(self) -> None:
        self._conn.close()

    def ours(self) -> dict[int, float]:
        if self.postmaster is None:
            return {}
        pids = [int(r[0]) for r in self._conn.execute(OUR_SERVER_PROCESSES_SQL).fetchall()]
        return {pid: cpu for pid in pids if (cpu := cpu_seconds(pid)) is not None}

    def everything(self) -> float | None:
        if self.postmaster is None:
            return None
        total = cpu_seconds(self.postmaster, children=True)
        if total is None:
            return None
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and _parent_pid(int(entry.name)) == self.postmaster:
                total += cpu_seconds(int(entry.name)) or 0.0
        return total


@dataclass
class CpuSnapshot:
    at: float
    processes: dict[int, float]
    server: dict[int, float]
    server_all: float | None
    machine_busy: float
    machine_total: float


def cpu_snapshot(pids: Iterable[int], server: ServerCpu) -> CpuSnapshot:
    busy, total = system_cpu()
    return CpuSnapshot(
        at=time.perf_counter(),
        processes={pid: cpu_seconds(pid) or 0.0 for pid in pids},
        server=server.ours(),
        server_all=server.everything(),
        machine_busy=busy,
        machine_total=total,
    )


def cpu_between(start: CpuSnapshot, end: CpuSnapshot) -> dict[str, Any]:
    """CPU seconds spent between two snapshots: each process, the server (ours, and all of it), the
    whole machine. A server process born in between counts from zero; one gone by the end is lost."""
    wall = end.at - start.at
    server = sum(cpu - start.server.get(pid, 0.0) for pid, cpu in end.server.items()) if end.server else None
    server_all = (end.server_all - start.server_all
                  if end.server_all is not None and start.server_all is not None else None)
    machine_busy = end.machine_busy - start.machine_busy
    machine_total = end.machine_total - start.machine_total
    return {
        "wall_s": wall,
        "processes_s": {str(pid): end.processes.get(pid, 0.0) - start.processes.get(pid, 0.0)
                        for pid in start.processes},
        "server_s": server,
        "server_all_s": server_all,
        "machine_busy_s": machine_busy,
        "machine_busy_fraction": machine_busy / machine_total if machine_total else None,
    }


# -- worker subprocesses ----------------------------------------------------------------------------


def checkout_spec(spec: str) -> tuple[str, Path, Path] | None:
    """`NAME=ROOT:VENV` (another checkout and its virtualenv, for a before/after in one run) as (name, root,
    venv), or None when a part is missing."""
    name, sep, where = spec.partition("=")
    root, sep2, venv = where.partition(":")
    if not (sep and sep2 and name and root and venv):
        return None
    return name, Path(root), Path(venv)


def spawn_worker(dsn: str, app: str, settings: dict[str, Any], log_path: Path,
                 python: str | None = None) -> subprocess.Popen[bytes]:
    """`python -m taskq.worker APP --flags` with the repository root as its working directory (so that
    `benchmarks.apps` imports); its log goes to `log_path`. `python`: another interpreter (a virtualenv
    with other packages installed), default this one."""
    args = [python or sys.executable, "-m", "taskq.worker", app]
    for name, value in settings.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    env = os.environ | {"TASKQ_DSN": dsn}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)


def stop_workers(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 30.0) -> list[int | None]:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    codes: list[int | None] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait(5))
    return codes


# -- statistics and output ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks. Kept here rather than
    taken from taskq.ops.bench: the scripts also run under older checkouts' interpreters (A/B runs)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Left-aligned first column, right-aligned figures."""
    text_rows = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in text_rows)]) for i, h in enumerate(headers)]
    for cells in [list(headers), *text_rows]:
        pairs = enumerate(zip(cells, widths, strict=True))
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in pairs))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def write_report(name: str, report: dict[str, Any], path: Path | None = None) -> Path:
    target = path or RESULTS_DIR / f"{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return target


def header(name: str, params: dict[str, Any], info: dict[str, Any], server: dict[str, Any]) -> dict[str, Any]:
    return {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "params": params,
        "machine": info,
        "load_warning": load_warning(info),
        "server": server,
    }


def as_url(dsn: str) -> str:
    """asyncpg reads only URLs; the benchmark's DSNs are libpq key=value strings."""
    if "://" in dsn:
        return dsn
    parts = conninfo_to_dict(dsn)
    user = quote(str(parts.pop("user", "")))
    password = parts.pop("password", None)
    auth = f"{user}:{quote(str(password))}@" if password else (f"{user}@" if user else "")
    dbname = quote(str(parts.pop("dbname", "")))
    return f"postgresql://{auth}/{dbname}?{urlencode({k: str(v) for k, v in parts.items()})}"
