"""Actors for the isolation tests. Process actors must be module-level functions of an importable
module: the child process imports them by module + qualname.

The in-process integration tests import this module as `apps.taskq_isolation_app` (`tests/` is on
sys.path because pytest puts the directory of the rootdir conftest there); worker subprocesses of the
system tests import it as `taskq_isolation_app` (their PYTHONPATH is tests/apps). A child process
inherits its worker's sys.path, so it imports the module under the same name as its worker did, and
no test touches sys.path or PYTHONPATH. Actor names are explicit, so both spellings name the same jobs.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from taskq import JobContext, NonRetryableError, RetryPolicy, Snooze, actor

FAST_RETRY = RetryPolicy(base=0.05, factor=1.0, jitter=0)


class Spin(BaseModel):
    """A CPU-bound loop. `path`, when given, receives the child's pid once it runs, and `cleanup` a line
    when its `finally` block runs."""

    seconds: float = 60.0
    path: str | None = None
    cleanup: str | None = None


def spin_until(deadline: float, stop: Any = None) -> int:
    """Pure-Python work (trial division) until `deadline` or until `stop()` is true."""
    n = found = 0
    while time.monotonic() < deadline:
        n += 1
        if all(n % d for d in range(2, int(n**0.5) + 1)):
            found += 1
        if stop is not None and n % 64 == 0 and stop():
            break
    return found


def _announce(payload: Spin, ctx: JobContext[Spin]) -> None:
    ctx.progress_sync({"pid": os.getpid()}, message="started")
    if payload.path:
        Path(payload.path).write_text(str(os.getpid()))


def _record_cleanup(payload: Spin) -> None:
    if payload.cleanup:
        Path(payload.cleanup).write_text("finally ran")


@actor(name="iso.proc.whoami", isolation="process")
def whoami(payload: int, ctx: JobContext[int]) -> dict[str, int]:
    return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "echo": payload}


@actor(name="iso.proc.cooperative", isolation="process")
def cooperative(payload: Spin, ctx: JobContext[Spin]) -> int:
    """Stops at the first cancel request, abandoning the work."""
    _announce(payload, ctx)
    spin_until(time.monotonic() + payload.seconds, lambda: ctx.cancellation_requested)
    if ctx.cancellation_requested:
        raise asyncio.CancelledError
    return 0


@actor(name="iso.proc.stubborn", isolation="process")
def stubborn(payload: Spin, ctx: JobContext[Spin]) -> int:
    """Ignores the cancel request, and even swallows every Exception: only a forced cancel stops it."""
    _announce(payload, ctx)
    try:
        deadline = time.monotonic() + payload.seconds
        while time.monotonic() < deadline:
            try:
                spin_until(min(deadline, time.monotonic() + 0.05))
            except Exception:
                pass
        return 0
    finally:
        _record_cleanup(payload)


@actor(name="iso.proc.deaf", isolation="process")
def deaf(payload: Spin, ctx: JobContext[Spin]) -> int:
    """Ignores SIGTERM itself: only SIGKILL stops it."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _announce(payload, ctx)
    spin_until(time.monotonic() + payload.seconds)
    return 0


class Die(BaseModel):
    how: str
    """'exit' (os._exit(3)) or 'segv' (SIGSEGV); only on the first attempt."""


@actor(name="iso.proc.die_once", isolation="process", max_attempts=3, retry=FAST_RETRY)
def die_once(payload: Die, ctx: JobContext[Die]) -> dict[str, int]:
    if ctx.attempt == 1:
        if payload.how == "exit":
            os._exit(3)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(10)
    return {"attempt": ctx.attempt}


@actor(name="iso.proc.checkpoints", isolation="process")
def checkpoints(payload: int, ctx: JobContext[int]) -> dict[str, Any]:
    """Two checkpoints and a child job, all through the worker."""
    before = ctx.last_progress
    ctx.progress_sync({"step": 1}, message="one")
    ctx.progress_sync({"step": payload}, message="two")
    kid = ctx.jobs.enqueue_sync("iso.proc.whoami", 7)
    return {"before": before, "last": ctx.last_progress, "kid": str(kid.job_id)}


@actor(name="iso.proc.unique_kids", isolation="process")
def unique_kids(payload: str, ctx: JobContext[str]) -> dict[str, Any]:
    """Two child jobs with one unique key, from a child process: the second is the first's handle."""
    # an actor no worker of the test runs, on a queue none consumes: a first child run (or failed as unknown)
    # before the second enqueue would free the key (scope active)
    one = ctx.jobs.enqueue_sync("iso.kid.elsewhere", 1, unique_key=payload, queue="kids")
    two = ctx.jobs.enqueue_sync("iso.kid.elsewhere", 2, unique_key=payload, queue="kids")
    return {"created": [one.created, two.created], "same": one.job_id == two.job_id, "kid": str(one.job_id)}


@actor(name="iso.proc.dependent", isolation="process")
def dependent(payload: int, ctx: JobContext[int]) -> dict[str, Any]:
    """Reads its parents' results from a child process; then enqueues a job that waits on this one."""
    parents = ctx.parent_results_sync()
    waiting = ctx.jobs.enqueue_sync("iso.proc.whoami", 3, depends_on=[ctx.job_id])
    return {"parents": {str(k): v for k, v in parents.items()}, "waiting": str(waiting.job_id),
            "waiting_status": str(waiting.row.status if waiting.row else None)}


class Boom(ValueError):
    pass


@actor(name="iso.proc.fails", isolation="process", max_attempts=2, retry=FAST_RETRY)
def fails(payload: str, ctx: JobContext[str]) -> int:
    if payload == "hopeless":
        raise NonRetryableError("no point trying again")
    raise Boom(f"bad luck on attempt {ctx.attempt}")


@actor(name="iso.thread.sleeps", isolation="thread")
def sleeps(payload: Spin, ctx: JobContext[Spin]) -> int:
    """Blocked in one long system call: an injected exception cannot reach it."""
    _announce(payload, ctx)
    time.sleep(payload.seconds)
    return 0


@actor(name="iso.async.waits")
async def waits(payload: float, ctx: JobContext[float]) -> int:
    """Waits for a cancel (or shutdown) and gives the attempt up."""
    await ctx.progress({"pid": os.getpid()}, message="started")
    await asyncio.wait_for(ctx.cancel_event.wait(), payload)
    raise asyncio.CancelledError


@actor(name="iso.proc.snoozes", isolation="process", max_attempts=1)
def snoozes(payload: int, ctx: JobContext[int]) -> list[int]:
    """Snoozes (0.05 s) on its first `payload` attempts, then returns [attempt, claim_epoch, pid]."""
    if ctx.attempt <= payload:
        raise Snooze(0.05)
    return [ctx.attempt, ctx.claim_epoch, os.getpid()]


actors = [whoami, cooperative, stubborn, deaf, die_once, checkpoints, unique_kids, fails, sleeps, waits, snoozes,
          dependent]
