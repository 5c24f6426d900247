"""`taskq bench`: the enqueue, drain and pickup figures of this machine against the user's own database, in
under a minute, without disturbing it (docs/bench.md).

A run owns one queue, `taskq-bench-<8 hex>`, and writes nothing elsewhere: its jobs go there, its worker
processes (`python -m taskq.worker taskq.ops.bench:actors`) listen only there, and at the end, also after an
error or Ctrl-C, it deletes every row it wrote (taskq.backend.bench): its jobs with their events and attempts
rows, its workers' rows, its queue's row. It needs the schema migrated (SchemaNotReady otherwise, as every
client) and a role that may delete from those tables (it checks before writing anything).

The figures, in the order they are taken:
1. drain: `jobs` no-op jobs written with enqueue_many, then `workers` worker processes started with the
   default settings, their pruner off (NO_PRUNING); jobs / (last finished_at - first started_at), from the rows;
2. pickup: jobs enqueued one per call at PICKUP_RATE a second for `seconds` to those workers, now idle;
   p50 and p99 of started_at - created_at (both the server's clock); then the workers are stopped (SIGTERM);
3. enqueue: `client.enqueue` of one job per call for `seconds`, then `enqueue_many` of BATCH jobs per call for
   `seconds`, each after an untimed warm-up (calls completed per second, on this side); those jobs wait in
   the queue, which no worker serves any more, for the clean-up.

The run is given a JobsClient (typed here as `Producer`: the clients are a layer above this one) opened with
`actors`, the registry of the one no-op actor; the caller owns the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol
from uuid import UUID

from taskq.actors.declaration import Actor, ActorRegistry, actor
from taskq.backend import Backend
from taskq.backend import bench as bench_store
from taskq.backend.bench import DeletedJobs, DeletedWorkers, JobRange
from taskq.exceptions import BenchFailed, ConfigurationError, DatabaseUnavailable

BENCH_QUEUE = "taskq-bench"
"""The actor's declared queue; a run uses a queue of its own, QUEUE_PREFIX + 8 hex digits."""
QUEUE_PREFIX = BENCH_QUEUE + "-"
NOOP = "taskq.bench.noop"
APP = "taskq.ops.bench:actors"
"""What the bench's worker processes run (this module's registry)."""

MAX_JOBS = 1_000_000
MAX_WORKERS = 64
MAX_SECONDS = 60.0
BATCH = 100
"""Jobs per enqueue_many call of the enqueue_many figure."""
PICKUP_RATE = 50.0
"""Jobs a second enqueued for the pickup figure: light enough that each finds a worker idle."""
WARMUP_SECONDS = 0.5
"""Untimed enqueue before each enqueue figure (at most its length): the first calls of a process pay for
prepared statements, the pool's connections and pydantic's first validations."""
POLL_INTERVAL = 0.5
"""Seconds between two looks at the rows while waiting for the workers (the figures come from the rows'
timestamps, not from these looks, which only cost the server a count)."""
STALL_TIMEOUT = 60.0
"""Seconds without a job finishing (or starting, for pickup) after which a run gives up."""
STOP_TIMEOUT = 30.0
"""Seconds a worker has to exit after SIGTERM before it is killed."""
DELETE_BATCH = 10_000
"""Jobs deleted per transaction by the clean-up."""
ID_MARGIN = 60.0
"""Seconds of clock either side of the run that the clean-up's id range also covers (a write cut short by an
error or Ctrl-C whose id the run never saw)."""

NO_PRUNING = tuple(
    arg for window in ("succeeded", "failed", "attempts", "receipts", "audit") for arg in (f"--retention-{window}", "0")
)
"""Keep-forever windows turn a bench worker's pruner off: it must not delete the database's own history."""
WORKER_ENV = ("TASKQ_DSN", "TASKQ_LISTEN_DSN", "TASKQ_TRANSACTION_POOLER", "TASKQ_DATA_DIR")
"""The TASKQ_* variables a bench worker keeps (how to reach the database); any other setting of the
environment would make its workers other than the defaults."""

actors = ActorRegistry(owner=APP)


@actor(name=NOOP, queue=BENCH_QUEUE, queues=[BENCH_QUEUE, QUEUE_PREFIX + "*"], registry=actors)
async def noop(payload: int) -> None:
    """The bench's job: nothing but the runtime's own bookkeeping. Bound to the bench queues only."""
    return None


class JobRef(Protocol):
    @property
    def job_id(self) -> UUID: ...


class Producer(Protocol):
    """What the run uses of a `taskq.client.JobsClient`."""

    @property
    def backend(self) -> Backend: ...

    async def enqueue(self, target: Actor[Any, Any], payload: Any, *, queue: str | None = ...) -> JobRef: ...

    async def enqueue_many(
        self, target: Actor[Any, Any], payloads: Iterable[Any], *, queue: str | None = ...
    ) -> Sequence[JobRef]: ...


@dataclass(frozen=True)
class BenchPlan:
    jobs: int = 50_000
    """No-op jobs the workers drain."""
    workers: int = 1
    """Worker processes that drain them (and then take the pickup jobs)."""
    seconds: float = 5.0
    """Length of each enqueue figure and of the pickup figure."""

    def __post_init__(self) -> None:
        check_count("jobs", self.jobs, MAX_JOBS)
        check_count("workers", self.workers, MAX_WORKERS)
        check_seconds(self.seconds)


def check_count(name: str, value: object, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ConfigurationError(f"{name} must be a whole number from 1 to {high:,}, got {value!r}")
    return value


def check_seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= MAX_SECONDS:
        # NaN fails the comparison too
        raise ConfigurationError(f"seconds must be a number above 0 and at most {MAX_SECONDS:g}, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Figure:
    metric: str
    value: float
    unit: str


@dataclass(frozen=True)
class Machine:
    cpus: int | None
    """Of the host running the bench and its workers (the database's may be another)."""
    postgresql: str
    synchronous_commit: str


@dataclass
class Deleted:
    """Rows the clean-up deleted, by kind."""

    jobs: int = 0
    events: int = 0
    attempts: int = 0
    other: int = 0
    """Steps, signals, dependency edges, backlog rows, lease losses, the queue's own row."""
    workers: int = 0

    def add_jobs(self, batch: DeletedJobs) -> None:
        self.jobs += batch.jobs
        self.events += batch.events
        self.attempts += batch.attempts
        self.other += batch.other

    def add_workers(self, batch: DeletedWorkers) -> None:
        self.workers += batch.workers
        self.other += batch.losses + batch.queue


@dataclass
class BenchReport:
    queue: str
    plan: BenchPlan
    machine: Machine
    figures: list[Figure] = field(default_factory=list)
    drained: int = 0
    pickup_jobs: int = 0
    deleted: Deleted = field(default_factory=Deleted)
    elapsed: float = 0.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), interpolated linearly between the closest ranks; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def new_queue_name() -> str:
    return QUEUE_PREFIX + secrets.token_hex(4)


def uuid7_floor(seconds: float) -> UUID:
    """The lowest version-7 UUID of that wall-clock moment (ids are ordered by their first 48 bits, in ms)."""
    return UUID(int=max(0, int(seconds * 1000)) << 80)


def uuid7_ceiling(seconds: float) -> UUID:
    return UUID(int=((int(seconds * 1000) + 1) << 80) - 1)


class IdSpan:
    """The lowest and highest job id the run wrote, and the wall-clock moments it wrote them between."""

    def __init__(self) -> None:
        self.started = time.time()
        self.lo: UUID | None = None
        self.hi: UUID | None = None

    def see(self, job_id: UUID) -> None:
        if self.lo is None or job_id < self.lo:
            self.lo = job_id
        if self.hi is None or job_id > self.hi:
            self.hi = job_id

    def see_all(self, refs: Sequence[JobRef]) -> None:
        if refs:
            ids = [r.job_id for r in refs]
            self.see(min(ids))
            self.see(max(ids))

    def cover(self, queue: str) -> JobRange:
        """Every id the run saw, and any it may have written without seeing it (within ID_MARGIN)."""
        lo, hi = uuid7_floor(self.started - ID_MARGIN), uuid7_ceiling(time.time() + ID_MARGIN)
        if self.lo is not None and self.hi is not None:
            lo, hi = min(lo, self.lo), max(hi, self.hi)
        return JobRange(queue, lo, hi)


Phase = Callable[[str], None]


class BenchRun:
    """One run: its queue, the ids and workers it wrote, and its steps. `run()` measures and always cleans."""

    def __init__(self, client: Producer, plan: BenchPlan, *, on_phase: Phase | None = None) -> None:
        self.client = client
        self.backend = client.backend
        self.plan = plan
        self.queue = new_queue_name()
        self.ids = IdSpan()
        self.worker_ids = [f"{self.queue}-{n + 1}" for n in range(plan.workers)]
        self.spawns: list[asyncio.Future[None]] = []
        self.procs: list[asyncio.subprocess.Process] = []
        self.on_phase = on_phase or (lambda text: None)
        self.logs = Path()

    async def run(self) -> BenchReport:
        """The figures; the run's rows are deleted whatever happens. SchemaNotReady came with the client;
        ConfigurationError (nothing written) if this role may not delete what a run writes."""
        start = time.perf_counter()
        facts = await bench_store.bench_server(self.backend)
        if facts.cannot_delete:
            raise ConfigurationError(
                f"taskq bench deletes the rows it writes, and this role may not delete from "
                f"{', '.join(facts.cannot_delete)}: run it with the DSN of the schema's owner (the role of "
                "`taskq migrate`); nothing was written"
            )
        report = BenchReport(
            self.queue, self.plan, Machine(os.cpu_count(), facts.server_version, facts.synchronous_commit)
        )
        with tempfile.TemporaryDirectory(prefix="taskq-bench-") as logs:
            self.logs = Path(logs)
            try:
                await self.measure(report)
            finally:
                self.on_phase("cleaning up")
                try:
                    await self.stop_workers()
                finally:
                    await self.clean_or_say_what_remains(report.deleted)
        report.elapsed = time.perf_counter() - start
        return report

    async def measure(self, report: BenchReport) -> None:
        """The drain and pickup first, with the workers, then the enqueue figures once the workers are gone (their
        jobs wait in the queue for the clean-up): no mass delete runs, and no autovacuum it would start, inside a
        measurement. The figures are listed enqueue, enqueue_many, drain, pickup."""
        seconds = self.plan.seconds
        self.on_phase(f"drain: {self.plan.jobs:,} jobs, {self.plan.workers} worker process(es)")
        backlog = await self.client.enqueue_many(noop, range(self.plan.jobs), queue=self.queue)
        self.ids.see_all(backlog)
        drained = JobRange(self.queue, min(r.job_id for r in backlog), max(r.job_id for r in backlog))
        await self.start_workers()
        await self.wait(lambda: bench_store.bench_unfinished(self.backend, self.queue), "finishing")
        span = await bench_store.bench_span(self.backend, drained)
        if span.succeeded != self.plan.jobs or not span.seconds:
            raise BenchFailed(
                f"of the {self.plan.jobs:,} drain jobs {span.succeeded:,} succeeded (the worker log "
                f"says why: {self.log_tail()})"
            )
        report.drained = span.jobs
        drain = Figure("drain", span.jobs / span.seconds, "jobs/s")

        count = max(1, round(PICKUP_RATE * seconds))
        self.on_phase(f"pickup: {count} jobs at {PICKUP_RATE:g}/s to the idle worker(s)")
        latencies = await self.pickup(count)
        report.pickup_jobs = len(latencies)
        pickup = [
            Figure("pickup p50", percentile(latencies, 50) * 1000, "ms"),
            Figure("pickup p99", percentile(latencies, 99) * 1000, "ms"),
        ]
        await self.stop_workers()

        warmup = min(WARMUP_SECONDS, seconds)
        self.on_phase(f"enqueue: one job per call for {seconds:g} s")
        await self.enqueue_single(warmup)
        single = Figure("enqueue", await self.enqueue_single(seconds), "jobs/s")
        self.on_phase(f"enqueue_many: {BATCH} jobs per call for {seconds:g} s")
        await self.enqueue_batches(warmup)
        many = Figure("enqueue_many", await self.enqueue_batches(seconds), "jobs/s")
        report.figures += [single, many, drain, *pickup]

    # -- the figures ----------------------------------------------------------------------------------

    async def enqueue_single(self, seconds: float) -> float:
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            self.ids.see((await self.client.enqueue(noop, n, queue=self.queue)).job_id)
            n += 1
        return n / (time.perf_counter() - start)

    async def enqueue_batches(self, seconds: float) -> float:
        payloads = list(range(BATCH))
        n = 0
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            self.ids.see_all(await self.client.enqueue_many(noop, payloads, queue=self.queue))
            n += BATCH
        return n / (time.perf_counter() - start)

    async def pickup(self, count: int) -> list[float]:
        ids: list[UUID] = []
        interval = 1.0 / PICKUP_RATE
        start = time.perf_counter()
        for i in range(count):
            # a steady rate: each job at its own moment, however long the last enqueue took
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            job_id = (await self.client.enqueue(noop, i, queue=self.queue)).job_id
            self.ids.see(job_id)
            ids.append(job_id)

        async def waiting() -> int:
            return (await bench_store.bench_pickup(self.backend, ids)).waiting

        await self.wait(waiting, "starting")
        return list((await bench_store.bench_pickup(self.backend, ids)).latencies)

    async def wait(self, left: Callable[[], Awaitable[int]], what: str) -> None:
        """Until `left()` (jobs still to go) is 0, while the workers live and the count moves."""
        last, moved = -1, time.perf_counter()
        while True:
            remaining = await left()
            if remaining == 0:
                return
            self.check_workers()
            now = time.perf_counter()
            if remaining != last:
                last, moved = remaining, now
            elif now - moved > STALL_TIMEOUT:
                raise BenchFailed(
                    f"{remaining:,} bench jobs were still waiting after {STALL_TIMEOUT:g} s without "
                    f"one {what} (worker log: {self.log_tail()})"
                )
            await asyncio.sleep(POLL_INTERVAL)

    # -- the worker processes -----------------------------------------------------------------------

    def worker_command(self, worker_id: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "taskq.worker",
            APP,
            "--queues",
            self.queue,
            "--worker-id",
            worker_id,
            *NO_PRUNING,
        ]

    def worker_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_") or k in WORKER_ENV}
        env["TASKQ_DSN"] = self.backend.dsn  # the environment, not argv: ps shows no password
        return env

    async def start_workers(self) -> None:
        env = self.worker_env()
        for worker_id in self.worker_ids:
            log = await asyncio.to_thread(open, self.logs / f"{worker_id}.log", "wb")
            # shielded: a cancel (Ctrl-C) cannot leave a worker started but unknown to stop_workers
            self.spawns.append(asyncio.ensure_future(self.spawn(worker_id, env, log)))
            await asyncio.shield(self.spawns[-1])

    async def spawn(self, worker_id: str, env: dict[str, str], log: BinaryIO) -> None:
        with log:  # the child writes to its own copy
            self.procs.append(
                await asyncio.create_subprocess_exec(
                    *self.worker_command(worker_id),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=log,
                    stderr=asyncio.subprocess.STDOUT,
                    env=env,
                    cwd=self.logs,
                )
            )

    def check_workers(self) -> None:
        for proc in self.procs:
            if proc.returncode is not None:
                raise BenchFailed(f"a bench worker exited with code {proc.returncode} ({self.log_tail()})")

    def log_tail(self) -> str:
        """The last line of the first worker log that has one."""
        for worker_id in self.worker_ids:
            try:
                lines = (self.logs / f"{worker_id}.log").read_text(errors="replace").strip().splitlines()
            except OSError:
                continue
            if lines:
                return lines[-1].strip()[:300]
        return "empty"

    async def stop_workers(self) -> None:
        """SIGTERM to every worker still running, then wait; kill those not gone within STOP_TIMEOUT."""
        await asyncio.gather(*self.spawns, return_exceptions=True)
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # exited, not yet reaped
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    # -- clean-up ---------------------------------------------------------------------------------------

    async def clean_or_say_what_remains(self, deleted: Deleted) -> None:
        try:
            await self.clean(deleted)
        except Exception as exc:
            remains = (
                f"deleting the bench's rows failed ({exc}); they remain in queue {self.queue}: jobs of that "
                "queue, their job_events and job_attempts rows (docs/bench.md shows how to delete them)"
            )
            if isinstance(exc, DatabaseUnavailable):
                raise DatabaseUnavailable(remains) from exc
            raise BenchFailed(remains) from exc

    async def clean(self, deleted: Deleted) -> None:
        """Delete the run's jobs (batch by batch, with their rows), then its workers' and queue's rows."""
        jobs = self.ids.cover(self.queue)
        after = UUID(int=max(0, jobs.lo.int - 1))
        while True:
            batch = await bench_store.bench_delete_jobs(self.backend, jobs, after=after, limit=DELETE_BATCH)
            deleted.add_jobs(batch)
            if batch.last is None:
                break
            after = batch.last
        deleted.add_workers(await bench_store.bench_delete_workers(self.backend, self.queue, self.worker_ids))


async def run_bench(client: Producer, plan: BenchPlan, *, on_phase: Phase | None = None) -> BenchReport:
    """Measure with `client` (a JobsClient opened with `actors`), and delete what the run wrote."""
    return await BenchRun(client, plan, on_phase=on_phase).run()
