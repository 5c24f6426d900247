"""CPU-bound example actors: one pure-Python prime count, run in a thread and in a child process.

Run a worker from the repository root, then enqueue:

    taskq worker examples.cpu:actors
    taskq enqueue examples.cpu.primes_process --payload '{"below": 3000000}'
    taskq enqueue examples.cpu.primes_thread --payload '{"below": 3000000, "report_every": 500000}'

Both check `ctx.cancellation_requested` between blocks and give the attempt up when asked. Had they not,
the worker would still stop them at phase 2: an exception injected into the thread, SIGTERM to the
child. The thread version shares the worker's GIL with its event loop, so heartbeats slow down while it
computes; the process version computes beside the loop. docs/isolation.md says which to pick.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable

from pydantic import BaseModel, Field

from taskq import JobContext, actor

BLOCK = 10_000
"""Numbers checked between two looks at the cancel flag (an even count keeps blocks on odd numbers)."""


class PrimeCount(BaseModel):
    below: int = Field(gt=2, le=1_000_000_000)
    report_every: int = Field(default=0, ge=0)
    """Save a progress checkpoint every this many numbers (0: never)."""


class PrimeCountResult(BaseModel):
    below: int
    count: int
    pid: int
    """The process that computed it: the worker's own for a thread, a child's for a process."""


def count_primes(
    below: int,
    *,
    should_stop: Callable[[], bool] = lambda: False,
    on_progress: Callable[[int, int], None] | None = None,
    report_every: int = 0,
) -> int | None:
    """The number of primes below `below`, by trial division: plain Python bytecode, deliberately
    CPU-bound. Returns None when `should_stop()` turns true (checked every BLOCK numbers)."""
    count = 1  # 2
    next_report = report_every
    for start in range(3, below, BLOCK):
        if should_stop():
            return None
        for n in range(start, min(start + BLOCK, below), 2):
            for d in range(3, math.isqrt(n) + 1, 2):
                if n % d == 0:
                    break
            else:
                count += 1
        if on_progress is not None and report_every and start + BLOCK >= next_report:
            on_progress(min(start + BLOCK, below), count)
            next_report += report_every
    return count


def _count(payload: PrimeCount, ctx: JobContext[PrimeCount]) -> PrimeCountResult:
    def checkpoint(checked: int, found: int) -> None:
        ctx.progress_sync({"checked": checked, "count": found})

    count = count_primes(
        payload.below,
        should_stop=lambda: ctx.cancellation_requested,
        on_progress=checkpoint,
        report_every=payload.report_every,
    )
    if count is None:
        raise asyncio.CancelledError  # a partial count is not an answer: give the attempt up
    return PrimeCountResult(below=payload.below, count=count, pid=os.getpid())


@actor(name="examples.cpu.primes_thread", isolation="thread")
def primes_thread(payload: PrimeCount, ctx: JobContext[PrimeCount]) -> PrimeCountResult:
    """In a thread of the worker: cheap to start, shares the worker's GIL."""
    return _count(payload, ctx)


@actor(name="examples.cpu.primes_process", isolation="process")
def primes_process(payload: PrimeCount, ctx: JobContext[PrimeCount]) -> PrimeCountResult:
    """In a warm child process: its own GIL, and a forced cancel or a crash cannot harm the worker."""
    return _count(payload, ctx)


actors = [primes_thread, primes_process]
