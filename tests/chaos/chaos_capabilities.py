"""The capabilities built since the chaos run was written, driven under the same faults and checked.

Beside the main workload (chaos.py) the producer enqueues, over the same window:

- `limited`: jobs on queue chaos-limited, which the producer limits first (3 running, 6 starts per second);
- `capped`: jobs of chaos.capped, an actor declared with `global_concurrency=2`;
- `fair`: jobs on queue chaos-fair with fairness keys `a` (three in four) and `b`;
- `paused`: jobs on queue chaos-paused, which the producer pauses at 30 % of the window and resumes at 55 %;
- `snooze`: chaos.snoozy jobs that snooze on their first one or two attempts;
- `requeue`: jobs that fail (max_attempts 1); once the producer reads one failed it requeues it (it fails again);
- `durable`: chaos.durable jobs: a step, a durable sleep, for half of them a wait for signal `go` (which the
  producer sends with `client.signal`), a second step;
- `unique`: every 0.5 s an enqueue with one of four unique keys (`chaos-u-N`, scope active);
- the schedule `chaos-every-second` of the fleet's APP (tests/apps/taskq_chaos_app.py), paused by the
  producer before the drain.

Every enqueue carries a retained unique key (`cap:<key>`), so that a retry after an indeterminate call
cannot write a job twice. Every call is recorded in the history (chaos_history.py) like the main workload's.
A sampler reads the database every 0.2 s (running jobs of the limited queue and of the capped actor, starts
of the limited queue in the last rate period, holders per unique key) and records the maxima; a sample
over a limit is a violation. The checks that read the database after the run are in chaos_checks.py
(CHAOS_CHECKS); the ones that need the producer's own times or the samples are here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import psycopg
from chaos_history import History
from chaos_history import now as history_now

from taskq.client import JobsClient
from taskq.exceptions import SignalRefused

KEY_PREFIX = "cap-"
"""Payload keys of the capability jobs (the main workload's accounting leaves them to the history's I1)."""
LIMITED_QUEUE, LIMITED_CONCURRENCY, RATE_LIMIT, RATE_PERIOD = "chaos-limited", 3, 6, 1.0
CAPPED_ACTOR, CAPPED_LIMIT = "chaos.capped", 2
FAIR_QUEUE, PAUSED_QUEUE = "chaos-fair", "chaos-paused"
SCHEDULE = "chaos-every-second"
UNIQUE_KEYS = 4
UNIQUE_PREFIX = "chaos-u-"
SAMPLE_EVERY = 0.2
RETRY_FOR = 60.0

SAMPLE = f"""
SELECT (SELECT count(*) FROM taskq.jobs WHERE status = 'running' AND queue = '{LIMITED_QUEUE}'),
       (SELECT count(*) FROM taskq.jobs WHERE status = 'running' AND actor = '{CAPPED_ACTOR}'),
       (SELECT count(*) FROM taskq.job_attempts a JOIN taskq.jobs j ON j.id = a.job_id
        WHERE j.queue = '{LIMITED_QUEUE}' AND a.started_at > clock_timestamp() - interval '{RATE_PERIOD} seconds'),
       (SELECT coalesce(max(n), 0) FROM (
            SELECT count(*) AS n FROM taskq.jobs
            WHERE left(unique_key, {len(UNIQUE_PREFIX)}) = '{UNIQUE_PREFIX}'
              AND status IN ('pending', 'scheduled', 'running')
            GROUP BY unique_key) AS held)
"""
SAMPLED = (
    ("running jobs of queue chaos-limited", LIMITED_CONCURRENCY),
    ("running jobs of actor chaos.capped", CAPPED_LIMIT),
    ("starts of queue chaos-limited in one rate period", RATE_LIMIT),
    ("holders of one unique key", 1),
)


@dataclass
class CapJob:
    at: float
    kind: str
    actor: str
    work: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    job_id: UUID | None = None


def make_capability_plan(rng: random.Random, jobs: int, window: float) -> list[CapJob]:
    """About one job in three of the main workload's count, spread over `window` seconds."""
    each = max(3, jobs // 25)
    plan: list[CapJob] = []

    def add(kind: str, actor: str, count: int, work: Callable[[int], dict[str, Any]], **options: Any) -> None:
        for i in range(count):
            key = f"{KEY_PREFIX}{kind}-{i:04d}"
            plan.append(CapJob(rng.uniform(0, window), kind, actor, {"key": key, **work(i)}, dict(options)))

    add("limited", "chaos.async", 2 * each, lambda i: {"seconds": rng.uniform(0.1, 0.5)}, queue=LIMITED_QUEUE)
    add("capped", CAPPED_ACTOR, each, lambda i: {"seconds": rng.uniform(0.2, 0.6)}, queue="chaos-capped")
    add("paused", "chaos.async", each, lambda i: {"seconds": rng.uniform(0, 0.1)}, queue=PAUSED_QUEUE)
    add("snooze", "chaos.snoozy", each, lambda i: {"seconds": 0.05, "snoozes": rng.choice([1, 2])})
    add("requeue", "chaos.async", max(2, each // 2), lambda i: {"always_fail": True}, max_attempts=1)
    add("durable", "chaos.durable", each, lambda i: {"sleep": 0.3, "signal": i % 2 == 0})
    for i in range(2 * each):
        key = f"{KEY_PREFIX}fair-{i:04d}"
        plan.append(CapJob(rng.uniform(0, window), "fair", "chaos.async", {"key": key, "seconds": rng.uniform(0, 0.2)},
                           {"queue": FAIR_QUEUE, "fairness_key": "a" if rng.random() < 0.75 else "b"}))
    plan.sort(key=lambda c: c.at)
    return plan


class Capabilities:
    """Drives the capability workload, the operator writes it needs, and the sampler."""

    def __init__(self, client: JobsClient, dsn: str, history: History, rng: random.Random, jobs: int,
                 window: float) -> None:
        self.client, self.dsn, self.history, self.rng, self.window = client, dsn, history, rng, window
        self.plan = make_capability_plan(rng, jobs, 0.75 * window)
        self.tasks: list[asyncio.Task[Any]] = []
        self.maxima = [0] * len(SAMPLED)
        self.over: list[str] = []
        self.samples = self.sample_errors = 0
        self.unique_calls = self.unique_created = 0
        self.pause_done: datetime | None = None
        self.resume_sent: datetime | None = None
        self.requeued: list[UUID] = []
        self.signalled = 0
        self.client_errors = 0

    async def _call(self, op: str, call: Callable[[], Awaitable[Any]], *, job_id: UUID | None = None,
                    key: str | None = None, unique_key: str | None = None) -> Any:
        """`call`, retried through faults for RETRY_FOR seconds; each try recorded ('ok' or 'info')."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_FOR
        while True:
            sent = history_now()
            try:
                result = await call()
            except SignalRefused as exc:  # the job ended before its signal: an answer, not a fault
                self.history.record(op, "ok", sent, job_id=job_id, key=key, detail=f"refused: {exc}")
                return None
            except Exception as exc:
                self.client_errors += 1
                self.history.record(op, "info", sent, job_id=job_id, key=key, unique_key=unique_key,
                                    detail=f"{type(exc).__name__}: {exc}")
                if loop.time() > deadline:
                    return None
                await asyncio.sleep(0.2)
                continue
            job_id = getattr(result, "job_id", job_id)
            self.history.record(op, "ok", sent, job_id=job_id, key=key, unique_key=unique_key,
                                detail=str(getattr(result, "created", "")))
            return result

    async def setup(self) -> None:
        await self._call("limits", lambda: self.client.set_queue_limits(
            LIMITED_QUEUE, concurrency=LIMITED_CONCURRENCY, rate_limit=RATE_LIMIT, rate_period=RATE_PERIOD))

    async def run(self, start: float) -> None:
        await asyncio.gather(self._enqueue_plan(start), self._unique(start), self._pause(start))
        await asyncio.gather(*self.tasks)

    async def _enqueue_plan(self, start: float) -> None:
        loop = asyncio.get_running_loop()
        for job in self.plan:
            await asyncio.sleep(max(0.0, start + job.at - loop.time()))
            self.tasks.append(loop.create_task(self._enqueue(job)))

    async def _enqueue(self, job: CapJob) -> None:
        unique_key = "cap:" + job.work["key"]
        handle = await self._call("enqueue", lambda: self.client.enqueue(
            job.actor, job.work, unique_key=unique_key, unique_scope="retained", **job.options),
            key=job.work["key"], unique_key=unique_key)
        if handle is None:
            return
        job.job_id = handle.job_id
        if job.kind == "requeue":
            await self._requeue_when_failed(handle.job_id)
        elif job.kind == "durable" and job.work.get("signal"):
            await asyncio.sleep(self.rng.uniform(0.3, 2.0))
            if await self._call("signal", lambda: self.client.signal(handle.job_id, "go", {"from": "chaos"}),
                                job_id=handle.job_id) is not None:
                self.signalled += 1

    async def _requeue_when_failed(self, job_id: UUID) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RETRY_FOR
        while loop.time() < deadline:
            await asyncio.sleep(0.3)
            with contextlib.suppress(Exception):
                handle = await self.client.get(job_id)
                if handle is not None and handle.row is not None and handle.row.status == "failed":
                    result = await self._call("requeue", lambda: self.client.requeue(
                        job_id, attempts=1, reason="chaos operator"), job_id=job_id)
                    if result is not None and result.requeued:
                        self.requeued.append(job_id)
                    return

    async def _unique(self, start: float) -> None:
        loop = asyncio.get_running_loop()
        n = 0
        while loop.time() < start + 0.75 * self.window:
            await asyncio.sleep(0.5)
            unique_key = f"{UNIQUE_PREFIX}{self.rng.randrange(UNIQUE_KEYS)}"
            key = f"{KEY_PREFIX}unique-{n:04d}"
            work = {"key": key, "seconds": self.rng.uniform(0.3, 1.2)}
            n += 1
            self.unique_calls += 1
            enqueue = functools.partial(self.client.enqueue, "chaos.async", work, unique_key=unique_key)
            handle = await self._call("enqueue_unique", enqueue, key=key, unique_key=unique_key)
            self.unique_created += bool(handle is not None and handle.created)

    async def _pause(self, start: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, start + 0.3 * self.window - loop.time()))
        if await self._call("pause", lambda: self.client.pause_queue(PAUSED_QUEUE, reason="chaos")) is not None:
            self.pause_done = self.history.ops[-1].done_at
        await asyncio.sleep(max(0.0, start + 0.55 * self.window - loop.time()))
        self.resume_sent = history_now()
        await self._call("resume", lambda: self.client.resume_queue(PAUSED_QUEUE, reason="chaos"))

    async def finish(self) -> None:
        """Before the drain: no more slot jobs (a slot made after the stop would never run)."""
        await self._call("pause_schedule", lambda: self.client.pause_schedule(SCHEDULE, by="chaos"))

    async def sample(self, stop: asyncio.Event) -> None:
        """Every SAMPLE_EVERY seconds until `stop`: the maxima of SAMPLED; a sample over a limit is named."""
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), SAMPLE_EVERY)
                try:
                    if conn is None or conn.closed:
                        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=3)
                    row = await (await conn.execute(SAMPLE)).fetchone()
                except (psycopg.Error, OSError):
                    self.sample_errors += 1
                    conn = None
                    continue
                assert row is not None
                self.samples += 1
                at = history_now()
                for i, ((what, limit), value) in enumerate(zip(SAMPLED, row, strict=True)):
                    self.maxima[i] = max(self.maxima[i], int(value))
                    if value > limit:
                        self.over.append(f"{at:%H:%M:%S.%f}: {value} {what} (limit {limit})")
        finally:
            if conn is not None:
                await conn.close()

    async def check(self) -> dict[str, list[str]]:
        """The checks that need the producer's times or the samples (the others are SQL, in chaos_checks)."""
        found: dict[str, list[str]] = {}
        if self.over:
            found["limits_sampled"] = self.over
        if self.pause_done is not None and self.resume_sent is not None:
            async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT a.job_id::text, format('attempt %%s claim %%s started at %%s, while the queue was paused', "
                    "a.attempt, a.claim_epoch, a.started_at) FROM taskq.job_attempts a JOIN taskq.jobs j "
                    "ON j.id = a.job_id WHERE j.queue = %s AND a.started_at > %s AND a.started_at < %s",
                    (PAUSED_QUEUE, self.pause_done, self.resume_sent))
                paused = [f"{job_id}: {detail}" for job_id, detail in await cur.fetchall()]
            if paused:
                found["pause_holds"] = paused
        elif self.pause_done is None:
            found["pause_holds"] = ["the pause was never acknowledged: nothing to check"]
        return found

    def figures(self) -> dict[str, Any]:
        kinds: dict[str, int] = {}
        for job in self.plan:
            kinds[job.kind] = kinds.get(job.kind, 0) + (job.job_id is not None)
        return {
            "capability jobs enqueued": ", ".join(f"{k}: {n}" for k, n in sorted(kinds.items())),
            "unique-key enqueues (calls / written)": f"{self.unique_calls} / {self.unique_created}",
            "jobs requeued after failing / signals sent": f"{len(self.requeued)} / {self.signalled}",
            "queue chaos-paused paused (acknowledged -> resume sent)":
                f"{self.pause_done:%H:%M:%S.%f} -> {self.resume_sent:%H:%M:%S.%f}"
                if self.pause_done and self.resume_sent else "never",
            **{f"max {what} (limit {limit})": m for (what, limit), m in zip(SAMPLED, self.maxima, strict=True)},
            "samples (failed)": f"{self.samples} ({self.sample_errors})",
        }
