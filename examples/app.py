"""Two example actors: run them with `taskq worker examples.app:actors` from the repository root.

    taskq enqueue examples.nap --payload '{"seconds": 2, "message": "hi"}'
    taskq enqueue examples.sum_primes --payload '{"below": 5000000}'

Both stop early when their job is cancelled: the async one wakes on `ctx.cancel_event`, the
CPU-bound one checks `ctx.cancellation_requested` between segments of its sieve.
"""

from __future__ import annotations

import asyncio
import math

from pydantic import BaseModel, Field

from taskq import JobContext, actor


class Nap(BaseModel):
    seconds: float = Field(default=0.5, ge=0, le=3600)
    message: str = "hello"


class NapResult(BaseModel):
    message: str
    slept: float


@actor(name="examples.nap")
async def nap(payload: Nap, ctx: JobContext[Nap]) -> NapResult:
    """Sleep a little (an I/O-bound stand-in), then echo the message. Runs on the worker's event loop."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await asyncio.wait_for(ctx.cancel_event.wait(), timeout=payload.seconds)
    except TimeoutError:
        return NapResult(message=payload.message, slept=round(loop.time() - started, 3))
    # Cancelled (or the worker is shutting down) before the nap ended: give the attempt up rather than
    # return a result that pretends the work was done. A shutdown re-runs the job elsewhere.
    raise asyncio.CancelledError


class PrimeRange(BaseModel):
    below: int = Field(gt=2, le=1_000_000_000)


class PrimeSum(BaseModel):
    below: int
    count: int
    total: int


SEGMENT = 1 << 18


@actor(name="examples.sum_primes", isolation="process")
def sum_primes(payload: PrimeRange, ctx: JobContext[PrimeRange]) -> PrimeSum:
    """Sum the primes below `below` with a segmented sieve. CPU-bound, so it runs in a child process,
    where it neither holds the worker's GIL nor survives a forced cancel (the child is terminated)."""
    limit = payload.below
    root = math.isqrt(limit - 1)
    small = bytearray([1]) * (root + 1)
    small[:2] = b"\x00\x00"
    for p in range(2, math.isqrt(root) + 1):
        if small[p]:
            small[p * p :: p] = bytes(len(range(p * p, root + 1, p)))
    base = [p for p in range(2, root + 1) if small[p]]
    count = total = 0
    for low in range(2, limit, SEGMENT):
        if ctx.cancellation_requested:
            raise asyncio.CancelledError  # abandon the sum: a partial one is not an answer
        high = min(low + SEGMENT, limit)
        segment = bytearray([1]) * (high - low)
        for p in base:
            if p * p >= high:
                break
            first = max(p * p, -(-low // p) * p)
            segment[first - low :: p] = bytes(len(range(first - low, high - low, p)))
        for offset in range(high - low):
            if segment[offset]:
                count += 1
                total += low + offset
    return PrimeSum(below=limit, count=count, total=total)


actors = [nap, sum_primes]
