"""Actors used by the process-level tests (imported by worker subprocesses via PYTHONPATH)."""

from __future__ import annotations

import asyncio
import time

from pydantic import BaseModel

from taskq import JobContext, actor


class Sleep(BaseModel):
    seconds: float
    cooperative: bool = True


@actor(name="test.sleep")
async def sleep(payload: Sleep, ctx: JobContext[Sleep]) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + payload.seconds
    while loop.time() < deadline:
        if payload.cooperative and ctx.cancellation_requested:
            raise asyncio.CancelledError
        await asyncio.sleep(0.01)
    return {"slept": payload.seconds}


@actor(name="test.sleep_once", max_attempts=1)
async def sleep_once(payload: Sleep, ctx: JobContext[Sleep]) -> dict[str, float]:
    await asyncio.sleep(payload.seconds)
    return {"slept": payload.seconds}


@actor(name="test.noop")
async def noop(payload: int, ctx: JobContext[int]) -> int:
    return payload


@actor(name="test.busy_thread")
def busy_thread(payload: float, ctx: JobContext[float]) -> float:
    end = time.monotonic() + payload
    while time.monotonic() < end:
        if ctx.cancellation_requested:
            raise InterruptedError("stopped on request")
        time.sleep(0.005)
    return payload


actors = [sleep, sleep_once, noop, busy_thread]


class Gate(BaseModel):
    path: str


@actor(name="test.gated")
async def gated(payload: Gate, ctx: JobContext[Gate]) -> dict[str, int]:
    """Attempt 1 waits until the gate file exists; later attempts return at once."""
    import os

    while ctx.attempt == 1 and not os.path.exists(payload.path):
        await asyncio.sleep(0.01)
    return {"attempt": ctx.attempt}


actors.append(gated)
