"""Enqueue throughput: JobsClient.enqueue against a raw psycopg INSERT, and enqueue_many in batches; the
same producers written as a lean psycopg loop and with PgQueuer, in the same run.

    python benchmarks/enqueue.py [--dsn DSN] [--seconds 3] [--rounds 3] [--slices 6]
                                 [--loop uvloop|asyncio] [--json benchmarks/results/enqueue.json]
                                 [--pgqueuer-venv DIR] [--checkout NAME=ROOT:VENV ...] [--only a,c,g,...]

The lean loop (g, h) is what a team would write by hand for a queue of its own (benchmarks/lean_queue.py:
one table with its primary key and one partial claim index), a prepared INSERT per job (g) or one INSERT
... SELECT FROM unnest of a binary array per batch (h), on one autocommit connection. PgQueuer (i, j;
PgQueuer 1.6 in a virtualenv of its own, `--pgqueuer-venv`, with asyncpg; left out when that virtualenv
is missing) runs in a subprocess (benchmarks/pgqueuer_app.py produce) and enqueues as its documentation
shows, one job per call (i) and lists of 100 (j); its schema is installed by its own code in the same
database. Every producer writes the same payload document. (k, l) write enqueue_many's rows by hand,
as a binary COPY and as the one unnest statement enqueue_many sends, to tell which way of writing a
batch is cheaper.

`--checkout NAME=ROOT:VENV` adds another taskq checkout's producers to the same run, for a before/after in
one run: its own database on the same server, migrated by that checkout (`VENV/bin/taskq migrate`), and
this script run under VENV's interpreter as a subprocess (`--produce`) measuring (a) and (c) with that
checkout's client, reported as `(a) NAME` and `(c) NAME` and taken in the same rotation as the rest.
`--only` keeps only the measurements named by their letters (a,c,g,h,...; a checkout's and PgQueuer's
legs are named by a and c, and i and j), to make a focused before/after shorter.

Without --dsn (and without TASKQ_DSN) it uses the embedded server. Either way it creates a fresh
database on that server, migrates it, and drops it at the end, so it needs CREATEDB rights.
Each round runs every measurement for --seconds, cut into --slices turns taken in rotation (so a burst
of noise on a shared machine hits all of them, not one); the median of the rounds is reported. The
jobs table is truncated before every turn, so each starts from the same (empty) table.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lean_queue
import psycopg
from _common import as_url, checkout_spec, cpu_model
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel

from taskq import sql
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import uuid7
from taskq.backend.migrations import migrate_dsn
from taskq.client import JobsClient
from taskq.dsn import redact_dsn, resolve_dsn

THIS_SCRIPT = Path(__file__).resolve()
DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "enqueue.json"
SINGLE_TARGET_RATIO = 0.80  # (a) must reach 80 % of (b)
BATCH_100_TARGET = 75_000.0  # jobs/s
LEAN_TARGET_RATIO = 0.80
PGQUEUER_SINGLE_TARGET = 1.2
PGQUEUER_BATCH_TARGET = 1.5
KEYS = 1000
"""Fairness keys of the keyed measurements (e) and (f)."""

registry = ActorRegistry()


class Image(BaseModel):
    url: str
    width: int
    height: int


@actor(name="bench.resize", registry=registry)
async def resize(payload: Image) -> None:
    return None


def _payload(i: int) -> dict[str, Any]:
    return {"url": f"s3://bucket/images/{i:08d}.png", "width": 640, "height": 480}


COPY_JOBS = ("COPY taskq.jobs (id, actor, queue, payload, priority, tags, max_attempts, idempotent)"
             " FROM STDIN (FORMAT BINARY)")
COPY_TYPES = ["uuid", "text", "text", "jsonb", "int4", "text[]", "int4", "bool"]
PGQUEUER_APP = Path(__file__).resolve().parent / "pgqueuer_app.py"
PGQUEUER_TABLES = "pgqueuer, pgqueuer_log, pgqueuer_statistics"

# The row (b) writes is the row (a) writes: same columns, same values, minus the client's checks.
RAW_INSERT = (
    "INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,"
    " scheduled_at, schedule_to_close, parent_id)"
    " VALUES (%s, %s, %s, %s::jsonb, 'pending', %s, %s::text[], %s, now(), NULL, NULL)"
)


_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def backend_cpu(pid: int | None) -> float | None:
    """CPU seconds of one PostgreSQL backend process, if the server runs on this machine. Only the
    backend serving our connection is counted: the server may be shared with other work."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "postgres":
                return None
    except OSError:
        return None
    fields = _stat_fields(pid)
    return None if fields is None else (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


async def backend_pid(conn: psycopg.AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT pg_backend_pid()")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@dataclass
class Sample:
    """Totals of one or more timed slices of one measurement."""

    jobs: int = 0
    seconds: float = 0.0
    client_cpu: float = 0.0  # this process
    server_cpu: float | None = 0.0  # the backend serving us; None if it is not on this machine

    def add(self, other: Sample) -> None:
        self.jobs += other.jobs
        self.seconds += other.seconds
        self.client_cpu += other.client_cpu
        self.server_cpu = (
            None if self.server_cpu is None or other.server_cpu is None else (self.server_cpu + other.server_cpu)
        )

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.seconds

    @property
    def client_cpu_us(self) -> float:
        return self.client_cpu / self.jobs * 1e6

    @property
    def server_cpu_us(self) -> float | None:
        return None if self.server_cpu is None else self.server_cpu / self.jobs * 1e6


@dataclass
class Measurement:
    name: str
    label: str
    run: Callable[[float], Awaitable[Sample]]
    rounds: list[Sample]


async def _timed(seconds: float, step: Callable[[], Awaitable[int]], pid: int) -> Sample:
    """Run `step` (which returns jobs written) back to back for `seconds`; `pid` is the serving backend."""
    jobs = 0
    server_before = backend_cpu(pid)
    cpu_before = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        jobs += await step()
        now = time.perf_counter()
        if now >= deadline:
            break
    client_cpu = time.process_time() - cpu_before
    server_after = backend_cpu(pid)
    server_cpu = None if server_before is None or server_after is None else server_after - server_before
    return Sample(jobs=jobs, seconds=now - start, client_cpu=client_cpu, server_cpu=server_cpu)


async def bench_enqueue_single(client: JobsClient, pid: int, seconds: float) -> Sample:
    counter = 0

    async def step() -> int:
        nonlocal counter
        counter += 1
        await client.enqueue(resize, _payload(counter))
        return 1

    return await _timed(seconds, step, pid)


async def bench_raw_insert(conn: psycopg.AsyncConnection[Any], pid: int, seconds: float) -> Sample:
    counter = 0

    async def step() -> int:
        nonlocal counter
        counter += 1
        payload = Image.model_validate(_payload(counter)).model_dump_json()
        await conn.execute(RAW_INSERT, (uuid7(), "bench.resize", "default", payload, 0, [], 3), prepare=True)
        return 1

    return await _timed(seconds, step, pid)


async def bench_lean(conn: psycopg.AsyncConnection[Any], pid: int, seconds: float, batch: int) -> Sample:
    """(g) / (h): the lean loop, one job per commit or one statement per `batch`."""
    counter = 0

    async def step() -> int:
        nonlocal counter
        if batch == 1:
            counter += 1
            await conn.execute(lean_queue.INSERT, ("default", json.dumps(_payload(counter))), prepare=True)
            return 1
        payloads = [json.dumps(_payload(counter + i)) for i in range(batch)]
        counter += batch
        await conn.execute(lean_queue.INSERT_MANY, ("default", payloads), prepare=True)
        return batch

    return await _timed(seconds, step, pid)


async def bench_raw_batch(conn: psycopg.AsyncConnection[Any], pid: int, seconds: float, batch: int,
                          copy: bool) -> Sample:
    """(k) / (l): the rows of enqueue_many written by hand, without the client's checks: a binary COPY
    (k) or the statement enqueue_many sends, one unnest of binary arrays (l). Which way is cheaper."""
    counter = 0
    statement = sql.query("job_insert_many")
    unset = {name: None for name in ("parent_id", "workflow_id", "scheduled_at", "schedule_to_close",
                                     "trace_context", "concurrency_key", "fairness_keys", "fairness_ranks")}

    async def step() -> int:
        nonlocal counter
        ids = [uuid7() for _ in range(batch)]
        payloads = [json.dumps(_payload(counter + i)) for i in range(batch)]
        counter += batch
        if copy:
            async with conn.cursor() as cur, cur.copy(COPY_JOBS) as writer:
                writer.set_types(COPY_TYPES)
                for job_id, payload in zip(ids, payloads, strict=True):
                    await writer.write_row((job_id, "bench.resize", "default", payload, 0, [], 3, True))
        else:
            await conn.execute(statement, unset | {
                "ids": ids, "payloads": payloads, "actor": "bench.resize", "queue": "default", "priority": 0,
                "tags": [], "max_attempts": 3, "idempotent": True, "notify": False}, prepare=True)
        return batch

    return await _timed(seconds, step, pid)


class SubprocessProducer:
    """A producer in a subprocess that answers each stdin line `BATCH SECONDS` with a line of JSON (jobs,
    seconds, its own CPU and its serving backend's): PgQueuer's, or another taskq checkout's."""

    def __init__(self, name: str, dsn: str) -> None:
        self.name = name
        self._dsn = dsn
        self._proc: asyncio.subprocess.Process | None = None

    async def run(self, seconds: float, batch: int) -> Sample:
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(f"{batch} {seconds}\n".encode())
        await proc.stdin.drain()
        line = await proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: its producer ended early")
        got = json.loads(line)
        return Sample(jobs=got["jobs"], seconds=got["seconds"], client_cpu=got["client_cpu_s"],
                      server_cpu=got["server_cpu_s"])

    async def close(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            await self._proc.wait()


class PgQueuerProducer(SubprocessProducer):
    """PgQueuer's producer in a subprocess of its own virtualenv (benchmarks/pgqueuer_app.py produce)."""

    def __init__(self, python: Path, dsn: str) -> None:
        super().__init__("PgQueuer", dsn)
        self._python = python

    async def start(self) -> None:
        app = str(PGQUEUER_APP)
        env = os.environ | {"PGDSN": as_url(self._dsn)}
        install = await asyncio.create_subprocess_exec(str(self._python), app, "install", env=env)
        if await install.wait() != 0:
            raise SystemExit("PgQueuer's install failed")
        self._proc = await asyncio.create_subprocess_exec(str(self._python), app, "produce", env=env,
                                                          stdin=asyncio.subprocess.PIPE,
                                                          stdout=asyncio.subprocess.PIPE)


class CheckoutProducer(SubprocessProducer):
    """Another taskq checkout's producers: this script under that checkout's interpreter (`--produce DSN`),
    on a database of its own that the checkout migrated. Each stdin line `BATCH SECONDS` truncates that
    database's jobs and enqueues for SECONDS (BATCH 1: `enqueue`, else `enqueue_many` of BATCH)."""

    def __init__(self, name: str, venv: Path, dsn: str) -> None:
        super().__init__(f"checkout {name}", dsn)
        self.checkout = name
        self._venv = venv

    async def start(self, loop: str) -> None:
        migrate = await asyncio.create_subprocess_exec(str(self._venv / "bin" / "taskq"), "migrate", "--dsn",
                                                       self._dsn, stdout=asyncio.subprocess.DEVNULL)
        if await migrate.wait() != 0:
            raise SystemExit(f"{self.name}: taskq migrate failed")
        self._proc = await asyncio.create_subprocess_exec(
            str(self._venv / "bin" / "python"), str(THIS_SCRIPT), "--produce", self._dsn,
            "--loop", loop, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)


async def produce(dsn: str) -> None:
    """The `--produce` side of CheckoutProducer, run under the other checkout's interpreter."""
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=1)
    try:
        async with client.backend.pool.connection() as conn:
            pid = await backend_pid(conn)
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := await reader.readline():
            batch, seconds = int(line.split()[0]), float(line.split()[1])
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.fair_queues")
                await conn.execute("VACUUM ANALYZE taskq.jobs")
            sample = await (bench_enqueue_single(client, pid, seconds) if batch == 1
                            else bench_enqueue_many(client, pid, seconds, batch))
            print(json.dumps({"jobs": sample.jobs, "seconds": sample.seconds, "client_cpu_s": sample.client_cpu,
                              "server_cpu_s": sample.server_cpu}), flush=True)
    finally:
        await client.close()


async def bench_enqueue_many(client: JobsClient, pid: int, seconds: float, batch: int) -> Sample:
    counter = 0

    async def step() -> int:
        nonlocal counter
        payloads = [_payload(counter + i) for i in range(batch)]
        counter += batch
        await client.enqueue_many(resize, payloads)
        return batch

    return await _timed(seconds, step, pid)


async def bench_enqueue_keyed(client: JobsClient, pid: int, seconds: float) -> Sample:
    """(e) as (a), each job with one of KEYS fairness keys in turn (a fair queue: each enqueue tags its job)."""
    counter = 0

    async def step() -> int:
        nonlocal counter
        counter += 1
        await client.enqueue(resize, _payload(counter), fairness_key=f"tenant-{counter % KEYS}")
        return 1

    return await _timed(seconds, step, pid)


async def bench_enqueue_many_keyed(client: JobsClient, pid: int, seconds: float, batch: int) -> Sample:
    """(f) as (c), each job of the batch with its own key of KEYS, in turn."""
    counter = 0

    async def step() -> int:
        nonlocal counter
        payloads = [_payload(counter + i) for i in range(batch)]
        keys: list[str | None] = [f"tenant-{(counter + i) % KEYS}" for i in range(batch)]
        counter += batch
        await client.enqueue_many(resize, payloads, fairness_key=keys)
        return batch

    return await _timed(seconds, step, pid)


async def _truncate(dsn: str, pgqueuer: bool) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # fair_queues too: a queue made fair by the keyed measurements would tag the others' jobs
        await conn.execute("TRUNCATE taskq.jobs, taskq.job_events, taskq.fair_queues, lean.jobs")
        if pgqueuer:
            await conn.execute(f"TRUNCATE {PGQUEUER_TABLES}")
        await conn.execute("VACUUM ANALYZE taskq.jobs")


def _median(samples: list[Sample], field: str) -> float | None:
    values = [getattr(x, field) for x in samples]
    return None if None in values else statistics.median(values)


async def run(dsn: str, seconds: float, rounds: int, slices: int, pgqueuer_python: Path | None,
              checkouts: list[CheckoutProducer] | None = None, only: set[str] | None = None,
              loop: str = "uvloop") -> dict[str, Any]:
    # one pooled connection, so that its backend's CPU is the server's share of the work
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=1)
    raw = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    lean = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    pgq = PgQueuerProducer(pgqueuer_python, dsn) if pgqueuer_python is not None else None
    try:
        for statement in lean_queue.SCHEMA:
            await lean.execute(statement)
        async with client.backend.pool.connection() as conn:
            client_pid = await backend_pid(conn)
        raw_pid = await backend_pid(raw)
        lean_pid = await backend_pid(lean)
        measurements = [
            Measurement(
                "enqueue_single",
                "(a) client.enqueue, 1 job/commit",
                lambda s: bench_enqueue_single(client, client_pid, s),
                [],
            ),
            Measurement(
                "raw_insert_single",
                "(b) raw psycopg INSERT, 1 row/commit",
                lambda s: bench_raw_insert(raw, raw_pid, s),
                [],
            ),
            Measurement(
                "enqueue_many_100",
                "(c) enqueue_many, batches of 100",
                lambda s: bench_enqueue_many(client, client_pid, s, 100),
                [],
            ),
            Measurement(
                "enqueue_many_1000",
                "(d) enqueue_many, batches of 1000",
                lambda s: bench_enqueue_many(client, client_pid, s, 1000),
                [],
            ),
            Measurement(
                "enqueue_single_keyed",
                "(e) (a) with 1 of 1,000 fairness keys",
                lambda s: bench_enqueue_keyed(client, client_pid, s),
                [],
            ),
            Measurement(
                "enqueue_many_100_keyed",
                "(f) (c) with 1,000 fairness keys",
                lambda s: bench_enqueue_many_keyed(client, client_pid, s, 100),
                [],
            ),
            Measurement("raw_copy_100", "(k) raw binary COPY, 100 rows",
                        lambda s: bench_raw_batch(raw, raw_pid, s, 100, copy=True), []),
            Measurement("raw_unnest_100", "(l) raw unnest INSERT, 100 rows",
                        lambda s: bench_raw_batch(raw, raw_pid, s, 100, copy=False), []),
            Measurement("lean_single", "(g) lean psycopg loop, 1 job/commit",
                        lambda s: bench_lean(lean, lean_pid, s, 1), []),
            Measurement("lean_many_100", "(h) lean psycopg loop, batches of 100",
                        lambda s: bench_lean(lean, lean_pid, s, 100), []),
        ]
        if pgq is not None:
            await pgq.start()
            measurements += [
                Measurement("pgqueuer_single", "(i) PgQueuer enqueue, 1 job/call", lambda s: pgq.run(s, 1), []),
                Measurement("pgqueuer_many_100", "(j) PgQueuer enqueue, lists of 100", lambda s: pgq.run(s, 100), []),
            ]
        for checkout in checkouts or []:
            await checkout.start(loop)
            measurements += [
                Measurement(f"enqueue_single@{checkout.checkout}", f"(a) {checkout.checkout}",
                            functools.partial(checkout.run, batch=1), []),
                Measurement(f"enqueue_many_100@{checkout.checkout}", f"(c) {checkout.checkout}",
                            functools.partial(checkout.run, batch=100), []),
            ]
        if only is not None:
            measurements = [m for m in measurements if m.label[1] in only]
        # warm up every path once (prepared statements, pool, caches), untimed
        for m in measurements:
            await m.run(min(0.5, seconds))
        for r in range(rounds):
            totals = {m.name: Sample() for m in measurements}
            # each round is cut into slices run in turn, so that a burst of noise on the machine hits
            # every measurement rather than one of them; every slice starts from an empty table
            for _ in range(slices):
                for m in measurements:
                    await _truncate(dsn, pgq is not None)
                    totals[m.name].add(await m.run(seconds / slices))
            for m in measurements:
                sample = totals[m.name]
                m.rounds.append(sample)
                server = "-" if sample.server_cpu_us is None else f"{sample.server_cpu_us:.1f}"
                print(
                    f"  round {r + 1}/{rounds} {m.name:<18} {sample.jobs_per_s:>10,.0f} jobs/s"
                    f"  client {sample.client_cpu_us:7.1f} us/job  server {server:>7} us/job",
                    file=sys.stderr,
                )
    finally:
        if pgq is not None:
            await pgq.close()
        for checkout in checkouts or []:
            await checkout.close()
        await lean.close()
        await raw.close()
        await client.close()
    results: dict[str, Any] = {
        m.name: {
            "label": m.label,
            "rounds": [x.jobs_per_s for x in m.rounds],
            "median": _median(m.rounds, "jobs_per_s"),
            "client_cpu_us_per_job": _median(m.rounds, "client_cpu_us"),
            "server_cpu_us_per_job": _median(m.rounds, "server_cpu_us"),
        }
        for m in measurements
    }
    results["targets"] = {}
    if {"enqueue_single", "raw_insert_single"} <= results.keys():
        ratio = results["enqueue_single"]["median"] / results["raw_insert_single"]["median"]
        results["targets"]["enqueue_single_vs_raw"] = {
            "ratio": ratio, "target": f">= {SINGLE_TARGET_RATIO:.2f}", "met": ratio >= SINGLE_TARGET_RATIO}
    if "enqueue_many_100" in results:
        many100 = results["enqueue_many_100"]["median"]
        results["targets"]["enqueue_many_100"] = {
            "jobs_per_s": many100, "target": f">= {BATCH_100_TARGET:,.0f}", "met": many100 >= BATCH_100_TARGET}
    # issue 34's producer targets: against the lean loop (>= 0.8) and PgQueuer (single >= 1.2, batch >= 1.5)
    peers = {"enqueue_single_vs_lean": ("enqueue_single", "lean_single", LEAN_TARGET_RATIO),
             "enqueue_many_100_vs_lean": ("enqueue_many_100", "lean_many_100", LEAN_TARGET_RATIO),
             "enqueue_single_vs_pgqueuer": ("enqueue_single", "pgqueuer_single", PGQUEUER_SINGLE_TARGET),
             "enqueue_many_100_vs_pgqueuer": ("enqueue_many_100", "pgqueuer_many_100", PGQUEUER_BATCH_TARGET)}
    for name, (ours, theirs, target) in peers.items():
        if {ours, theirs} <= results.keys():
            ratio = results[ours]["median"] / results[theirs]["median"]
            results["targets"][name] = {"ratio": ratio, "target": f">= {target:.2f}", "met": ratio >= target}
    # a checkout's producers against this one's (no target: the before/after of a change)
    results["checkouts"] = {
        f"{ours}_vs_{name}": {"ratio": results[ours]["median"] / results[f"{ours}@{name}"]["median"],
                              "server_cpu_us_per_job": [results[ours]["server_cpu_us_per_job"],
                                                        results[f"{ours}@{name}"]["server_cpu_us_per_job"]]}
        for name in sorted({k.split("@", 1)[1] for k in results if "@" in k})
        for ours in ("enqueue_single", "enqueue_many_100")
        if {ours, f"{ours}@{name}"} <= results.keys()}
    return results


def print_table(results: dict[str, Any]) -> None:
    order = ("enqueue_single", "raw_insert_single", "enqueue_many_100", "enqueue_many_1000", "enqueue_single_keyed",
             "enqueue_many_100_keyed", "raw_copy_100", "raw_unnest_100", "lean_single", "lean_many_100",
             "pgqueuer_single", "pgqueuer_many_100")
    names = [n for n in order if n in results] + [k for k in results if "@" in k]
    print(f"{'measurement':<38} {'jobs/s':>9} {'client us':>10} {'server us':>10}   rounds (jobs/s)")
    for name in names:
        r = results[name]
        rounds = ", ".join(f"{x:,.0f}" for x in r["rounds"])
        server = r["server_cpu_us_per_job"]
        server_text = "-" if server is None else f"{server:.1f}"
        client_text = f"{r['client_cpu_us_per_job']:.1f}"
        print(f"{r['label']:<38} {r['median']:>9,.0f} {client_text:>10} {server_text:>10}   {rounds}")
    print("(client us / server us: CPU per job of this process / of the PostgreSQL backend serving it)")
    t = results["targets"]
    if "enqueue_single_vs_raw" in t:
        ratio = t["enqueue_single_vs_raw"]
        print(f"(a)/(b) = {ratio['ratio']:.2f} (target {ratio['target']}): {'met' if ratio['met'] else 'MISSED'}")
    if "enqueue_many_100" in t:
        many = t["enqueue_many_100"]
        print(f"(c) = {many['jobs_per_s']:,.0f} jobs/s (target {many['target']}): {'met' if many['met'] else 'MISSED'}")
    for target, label in (("enqueue_single_vs_lean", "(a)/(g)"), ("enqueue_many_100_vs_lean", "(c)/(h)"),
                          ("enqueue_single_vs_pgqueuer", "(a)/(i)"), ("enqueue_many_100_vs_pgqueuer", "(c)/(j)")):
        if target in t:
            r = t[target]
            print(f"{label} = {r['ratio']:.2f} (target {r['target']}): {'met' if r['met'] else 'MISSED'}")
    for key, r in results.get("checkouts", {}).items():
        ours, name = key.split("_vs_")
        letter = "(a)" if ours == "enqueue_single" else "(c)"
        print(f"{letter} / {letter} {name} = {r['ratio']:.3f} (server us/job {r['server_cpu_us_per_job'][0]:.1f} "
              f"against {r['server_cpu_us_per_job'][1]:.1f})")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    admin = resolve_dsn(args.dsn)
    name = f"taskq_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    dsn = make_conninfo(admin, dbname=name)
    databases = [name]
    try:
        await migrate_dsn(dsn)
        with psycopg.connect(dsn) as conn:
            server_version = conn.info.server_version
            sync_commit = conn.execute("SHOW synchronous_commit").fetchone()
        print(
            f"benchmarking on {redact_dsn(dsn)} (PostgreSQL {server_version}), "
            f"{args.rounds} rounds of {args.seconds} s per measurement",
            file=sys.stderr,
        )
        pgq_python = args.pgqueuer_venv / "bin" / "python"
        if not pgq_python.exists():
            print(f"no PgQueuer virtualenv at {args.pgqueuer_venv}: its producer is left out", file=sys.stderr)
        checkouts = []
        for checkout, venv in args.checkout:
            databases.append(f"{name}_{checkout}")
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(databases[-1])))
            checkouts.append(CheckoutProducer(checkout, venv, make_conninfo(admin, dbname=databases[-1])))
        only = None if args.only is None else set(args.only.split(","))
        results = await run(dsn, args.seconds, args.rounds, args.slices, pgq_python if pgq_python.exists() else None,
                            checkouts, only, args.loop)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            for database in databases:
                conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(database)))
    return {
        "benchmark": "enqueue",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "cpu_model": cpu_model(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "server": {"version": server_version, "synchronous_commit": sync_commit[0] if sync_commit else None},
        "params": {
            "seconds": args.seconds,
            "rounds": args.rounds,
            "slices": args.slices,
            "loop": args.loop,
            "payload": _payload(0),
            "pgqueuer_venv": str(args.pgqueuer_venv),
            "checkouts": {checkout: str(venv) for checkout, venv in args.checkout},
            "only": args.only,
        },
        "results": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help="server to benchmark on (default: TASKQ_DSN, else embedded)")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument(
        "--slices", type=int, default=6, help="each round's time per measurement is cut into this many turns"
    )
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop (default uvloop)")
    parser.add_argument("--pgqueuer-venv", type=Path, default=Path("/work/venv-pgqueuer"),
                        help="a virtualenv with pgqueuer and asyncpg (its producer legs; left out if missing)")
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=ROOT:VENV",
                        help="another taskq checkout's producers (a) and (c) in the same run (repeatable)")
    parser.add_argument("--only", default=None, metavar="a,c,g,...", help="only the measurements of these letters")
    parser.add_argument("--produce", default=None, metavar="DSN", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where to write results ({DEFAULT_JSON})")
    args = parser.parse_args()
    checkouts: list[tuple[str, Path]] = []
    for spec in args.checkout:
        parsed = checkout_spec(spec)
        if parsed is None or not parsed[0].isidentifier() or not (parsed[2] / "bin" / "taskq").exists():
            parser.error(f"--checkout {spec!r}: expected NAME=ROOT:VENV, VENV with bin/taskq")
        checkouts.append((parsed[0], parsed[2]))
    args.checkout = checkouts
    if args.produce is not None:
        produced = produce(args.produce)
        if args.loop == "uvloop":
            import uvloop

            uvloop.run(produced)
        else:
            asyncio.run(produced)
        return
    if args.loop == "uvloop":
        import uvloop

        report = uvloop.run(main_async(args))
    else:
        report = asyncio.run(main_async(args))
    print_table(report["results"])
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
