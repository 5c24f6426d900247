"""Actors used by the worker benchmarks.

Worker subprocesses import this as `benchmarks.apps:actors` (they run with the repository root as
their working directory); the benchmark scripts import it as their sibling module `apps`. Both
register into the module's own registry, never the default one.
"""

from __future__ import annotations

import asyncio
import time

from taskq import JobContext
from taskq.actors.declaration import ActorRegistry, actor

registry = ActorRegistry()

NOOP = "bench.noop"
STAMP = "bench.stamp"
SLEEP = "bench.sleep"


@actor(name=NOOP, registry=registry)
async def noop(payload: int) -> None:
    """The throughput benchmark's job: nothing but the runtime's own bookkeeping."""
    return None


@actor(name=STAMP, registry=registry)
async def stamp(payload: float) -> float:
    """The latency benchmark's job: the payload is the enqueue time; the result is the start time
    (both `time.time()` on the same host)."""
    return time.time()


@actor(name=SLEEP, registry=registry)
async def sleep(payload: float, ctx: JobContext[float]) -> None:
    """Hold a slot for `payload` seconds, or until the worker asks it to stop (then it is released)."""
    try:
        await asyncio.wait_for(ctx.cancel_event.wait(), payload)
    except TimeoutError:
        return
    raise asyncio.CancelledError


actors = registry


WAIT_CANCEL = "bench.wait_cancel"


@actor(name=WAIT_CANCEL, registry=registry)
async def wait_cancel(payload: float, ctx: JobContext[float]) -> float:
    """The cancel-latency benchmark's job: waits for the cancel request, and returns the moment it saw
    it (`time.time()`); returning after a request is a success, so the result is kept."""
    await asyncio.wait_for(ctx.cancel_event.wait(), payload)
    return time.time()


STEPS = "bench.steps"
WAITER = "bench.waiter"


def _noop_step() -> int:
    return 1


@actor(name=STEPS, registry=registry)
async def steps(payload: int, ctx: JobContext[int]) -> None:
    """The durable benchmark's job: `payload` no-op steps (each stored once, fenced)."""
    for n in range(payload):
        await ctx.step(str(n), _noop_step)


@actor(name=WAITER, registry=registry)
async def waiter(payload: int, ctx: JobContext[int]) -> float:
    """The signal benchmark's job: waits for signal 'go', and returns the moment it resumed with it."""
    await ctx.wait_for_signal("go")
    return time.time()
