"""Actors of the chaos run (tests/chaos): one body, run in asyncio, in a thread and in a child process.

Every execution records itself in `chaos.effects` (see tests/chaos/chaos.py for the table): a row
when the actor starts (job, attempt, claim_epoch, isolation, pid, a fresh token) and, when it ends,
how (`returned`, `raised`, `cancelled`) and, for `returned`, the exact result it is about to return.
The result carries the same token, so the checker can tell which execution a stored result came from.
The effects row is written on the actor's own connection, outside taskq: an execution that taskq
fenced out still leaves its row, which is the point.

The payload (`Work`) says what to do: work for `seconds` (sleeping, or computing with `cpu`), fail on
the first `fail_attempts` attempts or always, enqueue `children` child jobs first, and on an operator's
cancel either raise (the job ends cancelled) or return a partial result (`cancel_returns`: it ends
succeeded). `chaos.stubborn` ignores even the forced cancel, until the worker SIGKILLs its child.

Imported by worker subprocesses as `taskq_chaos_app` (PYTHONPATH=tests/apps) and by in-process
tests as `apps.taskq_chaos_app`; actor names are explicit, so both name the same jobs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from pydantic import BaseModel

from taskq import CancelOrigin, JobContext, RetryPolicy, Schedule, Snooze, actor
from taskq.actors.thread import ActorInterrupted

EFFECTS_DSN_ENV = "TASKQ_CHAOS_EFFECTS_DSN"
"""Where the effects table lives; default TASKQ_DSN (the chaos database itself). The run's history
database when it has one (`--history-dsn`): a commit the database under test loses cannot take the
execution's own record with it."""
RUN_ENV = "TASKQ_CHAOS_RUN"
"""The run's id (set by tests/chaos/chaos_fleet.py), stored on every effects row: one history database
can keep several runs."""
EFFECT_WRITE_BUDGET = 8.0
"""Seconds an effect write keeps retrying through a database outage before the actor gives up (raises)."""
CHILD_ACTOR = "chaos.async"
RETRY = RetryPolicy(base=0.1, factor=2.0, max_delay=1.0, jitter=0.2)
STEP = 0.02


class Work(BaseModel):
    key: str
    seconds: float = 0.0
    cpu: bool = False
    fail_attempts: int = 0
    always_fail: bool = False
    children: int = 0
    cancel_returns: bool = False
    snoozes: int = 0
    """chaos.snoozy: snooze (0.2 s) on the first `snoozes` attempts."""
    sleep: float = 0.0
    """chaos.durable: a durable sleep of this many seconds between its two steps."""
    signal: bool = False
    """chaos.durable: wait for signal `go` (sent by the producer) after the sleep."""


class Produced(BaseModel):
    """The result: who produced it (token, attempt, claim_epoch) and what it did."""

    key: str
    token: str
    attempt: int
    claim_epoch: int
    isolation: str
    partial: bool
    children: list[str]
    steps: list[str] = []
    """chaos.durable: the tokens its two steps returned (stored once, returned on every run)."""


class ChaosFailure(Exception):
    """The failure a Work asks for (retried by taskq while attempts remain)."""


class EffectsUnavailable(Exception):
    """The effects table could not be written within EFFECT_WRITE_BUDGET (a long database outage)."""


# -- the effects table ------------------------------------------------------------------------------


class _EffectsConnection:
    """One connection per process, shared by the threads of a worker under a lock, reconnected after
    any error. Waits are short slices, so an interrupted actor thread leaves it within 0.1 s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._pid = os.getpid()

    def run(self, query: str, params: tuple[Any, ...]) -> None:
        deadline = time.monotonic() + EFFECT_WRITE_BUDGET
        delay = 0.05
        while True:
            try:
                self._run_once(query, params)
                return
            except (psycopg.Error, OSError, TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise EffectsUnavailable(f"effects not written: {exc}") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)

    def _run_once(self, query: str, params: tuple[Any, ...]) -> None:
        while not self._lock.acquire(timeout=0.1):
            pass
        try:
            if self._pid != os.getpid():  # inherited through a fork: never share a socket
                self._conn, self._pid = None, os.getpid()
            if self._conn is None or self._conn.closed:
                dsn = os.environ.get(EFFECTS_DSN_ENV) or os.environ["TASKQ_DSN"]
                self._conn = psycopg.connect(dsn, autocommit=True, connect_timeout=2)
            try:
                self._conn.execute(query, params)
            except BaseException:
                conn, self._conn = self._conn, None
                with contextlib.suppress(Exception):
                    conn.close()
                raise
        finally:
            self._lock.release()

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


_effects = _EffectsConnection()


def close_effects() -> None:
    """Close this process's effects connection (in-process tests)."""
    _effects.close()


def worker_of_this_process(isolation: str) -> str:
    """`host:pid` of the worker running this execution: the first two parts of its worker id (a process
    actor's child is spawned by the worker itself)."""
    return f"{socket.gethostname()}:{os.getppid() if isolation == 'process' else os.getpid()}"


def record_start(ctx: Any, isolation: str) -> str:
    # began_at is this host's clock, read before any write: a start delayed by a slow effects write
    # still tells when the execution began (the producer's terminal sightings use the same clock)
    began_at = datetime.now(UTC)
    token = str(uuid.uuid4())
    _effects.run(
        "INSERT INTO chaos.effects (job_id, attempt, claim_epoch, actor, isolation, pid, token, run, worker, "
        "began_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (token) DO NOTHING",
        (ctx.job_id, ctx.attempt, ctx.claim_epoch, ctx.actor_name, isolation, os.getpid(), token,
         os.environ.get(RUN_ENV, ""), worker_of_this_process(isolation), began_at),
    )
    return token


def record_end(token: str, outcome: str, result: Produced | None = None) -> None:
    _effects.run(
        "UPDATE chaos.effects SET finished_at = clock_timestamp(), outcome = %s, result = %s::jsonb, "
        "children = %s::uuid[] WHERE token = %s",
        (outcome, result.model_dump_json() if result else None, result.children if result else None, token),
    )


def record_end_quietly(token: str, outcome: str) -> None:
    """Best effort, for executions that end without a result (the record is informational)."""
    with contextlib.suppress(BaseException):
        record_end(token, outcome)


# -- the body, async and sync ---------------------------------------------------------------------


def _produced(work: Work, ctx: Any, token: str, isolation: str, children: list[str], partial: bool) -> Produced:
    return Produced(key=work.key, token=token, attempt=ctx.attempt, claim_epoch=ctx.claim_epoch,
                    isolation=isolation, partial=partial, children=children)


def _child_work(work: Work, ctx: Any, i: int) -> dict[str, Any]:
    return {"key": f"{work.key}/e{ctx.claim_epoch}/c{i}", "seconds": 0.05}


def _must_fail(work: Work, ctx: Any) -> bool:
    return work.always_fail or ctx.attempt <= work.fail_attempts


async def _finish_async(token: str, result: Produced) -> Produced:
    await asyncio.to_thread(record_end, token, "returned", result)
    return result


def _end_in_background(token: str, outcome: str) -> None:
    threading.Thread(target=record_end_quietly, args=(token, outcome), daemon=True).start()


QUEUES = ["default", "chaos-*"]
"""The chaos actors run on the queues the capability workload uses (tests/chaos/chaos_capabilities.py)."""


@actor(name="chaos.async", max_attempts=5, retry=RETRY, queues=QUEUES)
async def chaos_async(work: Work, ctx: JobContext[Work]) -> Produced:
    token = await asyncio.to_thread(record_start, ctx, "async")
    try:
        children = [str((await ctx.jobs.enqueue(CHILD_ACTOR, _child_work(work, ctx, i), max_attempts=5)).job_id)
                    for i in range(work.children)]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + work.seconds
        while loop.time() < deadline:
            if ctx.cancellation_requested:
                if ctx.cancel_origin is CancelOrigin.OPERATOR and work.cancel_returns:
                    return await _finish_async(token, _produced(work, ctx, token, "async", children, True))
                with contextlib.suppress(Exception):
                    await ctx.progress({"token": token}, message="interrupted")
                raise asyncio.CancelledError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ctx.cancel_event.wait(), min(STEP * 5, max(0.0, deadline - loop.time())))
        if _must_fail(work, ctx):
            raise ChaosFailure(f"{work.key}: failing attempt {ctx.attempt} on purpose")
        return await _finish_async(token, _produced(work, ctx, token, "async", children, False))
    except asyncio.CancelledError:
        _end_in_background(token, "cancelled")
        raise
    except Exception:
        _end_in_background(token, "raised")
        raise


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(200))


def _sync_body(work: Work, ctx: Any, isolation: str, *, stubborn: bool = False) -> Produced:
    token = record_start(ctx, isolation)
    try:
        children = [str(ctx.jobs.enqueue_sync(CHILD_ACTOR, _child_work(work, ctx, i), max_attempts=5).job_id)
                    for i in range(work.children)]
        deadline = time.monotonic() + work.seconds
        while time.monotonic() < deadline:
            if ctx.cancellation_requested and not stubborn:
                if ctx.cancel_origin is CancelOrigin.OPERATOR and work.cancel_returns:
                    result = _produced(work, ctx, token, isolation, children, True)
                    record_end(token, "returned", result)
                    return result
                raise asyncio.CancelledError
            try:
                _spin(STEP) if work.cpu else time.sleep(STEP)
            except ActorInterrupted:
                if not stubborn:
                    raise
        if _must_fail(work, ctx):
            raise ChaosFailure(f"{work.key}: failing attempt {ctx.attempt} on purpose")
        result = _produced(work, ctx, token, isolation, children, False)
        record_end(token, "returned", result)
        return result
    except (asyncio.CancelledError, ActorInterrupted):
        record_end_quietly(token, "cancelled")
        raise
    except Exception:
        record_end_quietly(token, "raised")
        raise


@actor(name="chaos.thread", max_attempts=5, retry=RETRY, queues=QUEUES)
def chaos_thread(work: Work, ctx: JobContext[Work]) -> Produced:
    return _sync_body(work, ctx, "thread")


@actor(name="chaos.process", isolation="process", max_attempts=5, retry=RETRY)
def chaos_process(work: Work, ctx: JobContext[Work]) -> Produced:
    return _sync_body(work, ctx, "process")


@actor(name="chaos.stubborn", isolation="process", max_attempts=5, retry=RETRY)
def chaos_stubborn(work: Work, ctx: JobContext[Work]) -> Produced:
    """Ignores every cancel, the forced one (SIGTERM) included: only SIGKILL ends it early."""
    return _sync_body(work, ctx, "process", stubborn=True)


# -- the capabilities built since (tests/chaos/chaos_capabilities.py drives them) ------------------


@actor(name="chaos.snoozy", max_attempts=3, retry=RETRY)
async def chaos_snoozy(work: Work, ctx: JobContext[Work]) -> Produced:
    """Snoozes on its first `snoozes` attempts (a snooze gives the attempt back), then returns."""
    token = await asyncio.to_thread(record_start, ctx, "async")
    if ctx.attempt <= work.snoozes:
        _end_in_background(token, "snoozed")
        raise Snooze(0.2)
    await asyncio.sleep(work.seconds)
    return await _finish_async(token, _produced(work, ctx, token, "async", [], False))


@actor(name="chaos.capped", queue="chaos-capped", global_concurrency=2, max_attempts=5, retry=RETRY)
async def chaos_capped(work: Work, ctx: JobContext[Work]) -> Produced:
    """An actor limited to 2 running jobs across the fleet (the sampler checks it)."""
    token = await asyncio.to_thread(record_start, ctx, "async")
    try:
        await asyncio.sleep(work.seconds)
    except asyncio.CancelledError:
        _end_in_background(token, "cancelled")
        raise
    return await _finish_async(token, _produced(work, ctx, token, "async", [], False))


def record_step_effect(ctx: Any, step: str) -> str:
    """The side effect of a durable step: one row per run of the step's function."""
    token = str(uuid.uuid4())
    _effects.run(
        "INSERT INTO chaos.step_effects (run, job_id, step, attempt, claim_epoch, token) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (os.environ.get(RUN_ENV, ""), ctx.job_id, step, ctx.attempt, ctx.claim_epoch, token),
    )
    return token


@actor(name="chaos.durable", max_attempts=5, retry=RETRY)
async def chaos_durable(work: Work, ctx: JobContext[Work]) -> Produced:
    """Two steps with a durable sleep and (`signal`) a wait for signal `go` between them: every run after a
    suspension starts from the top, the completed steps returning their stored tokens."""
    token = await asyncio.to_thread(record_start, ctx, "async")
    outcome = "raised"
    try:
        first = await ctx.step("charge", _step_effect, ctx, "charge")
        if work.sleep:
            await ctx.sleep(work.sleep)
        if work.signal:
            await ctx.wait_for_signal("go", timeout=120.0)
        second = await ctx.step("ship", _step_effect, ctx, "ship")
        if _must_fail(work, ctx):
            raise ChaosFailure(f"{work.key}: failing attempt {ctx.attempt} on purpose")
        outcome = "returned"
        result = _produced(work, ctx, token, "async", [], False).model_copy(update={"steps": [first, second]})
        return await _finish_async(token, result)
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    except BaseException:  # the suspension of a sleep or a wait is a BaseException
        outcome = "suspended" if ctx.suspension is not None else "raised"
        raise
    finally:
        if outcome != "returned":
            _end_in_background(token, outcome)


async def _step_effect(ctx: Any, step: str) -> str:
    return await asyncio.to_thread(record_step_effect, ctx, step)


actors = [chaos_async, chaos_thread, chaos_process, chaos_stubborn, chaos_snoozy, chaos_capped, chaos_durable]

SCHEDULE_EVERY = 1.0
schedule = Schedule(name="chaos-every-second", actor=chaos_async, every=timedelta(seconds=SCHEDULE_EVERY),
                    payload=Work(key="cap-schedule", seconds=0.05))
app = [*actors, schedule]
"""What the chaos fleet runs: the actors and a schedule (the in-process tests run `actors` alone)."""

__all__ = ["EFFECTS_DSN_ENV", "RUN_ENV", "Produced", "Work", "actors", "app", "close_effects"]
