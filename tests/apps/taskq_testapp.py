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


@actor(name="test.echo_fail", max_attempts=1)
async def echo_fail(payload: dict[str, str]) -> None:
    """Fails with a ValueError that does not mention its payload (the log tests look for it)."""
    raise ValueError("refused")


@actor(name="test.busy_thread")
def busy_thread(payload: float, ctx: JobContext[float]) -> float:
    end = time.monotonic() + payload
    while time.monotonic() < end:
        if ctx.cancellation_requested:
            raise InterruptedError("stopped on request")
        time.sleep(0.005)
    return payload


@actor(name="test.charge", idempotent=False, max_attempts=3)
async def charge(payload: Sleep, ctx: JobContext[Sleep]) -> dict[str, float]:
    """Work that must not run twice (a payment): never retried after a crash, a lost lease or a forced stop."""
    return await sleep.fn(payload, ctx)  # type: ignore[no-any-return]


actors = [sleep, sleep_once, noop, busy_thread, charge]


class Gate(BaseModel):
    path: str


@actor(name="test.gated")
async def gated(payload: Gate, ctx: JobContext[Gate]) -> dict[str, int]:
    """Attempt 1 waits until the gate file exists; later attempts return at once."""
    from pathlib import Path

    gate = Path(payload.path)
    while ctx.attempt == 1 and not gate.exists():  # noqa: ASYNC110, ASYNC240 - a file another process makes
        await asyncio.sleep(0.01)
    return {"attempt": ctx.attempt}


actors.append(gated)


class Checkpoint(BaseModel):
    steps: int


@actor(name="test.checkpointing")
async def checkpointing(payload: Checkpoint, ctx: JobContext[Checkpoint]) -> dict[str, int]:
    """Resumes from its progress; on a shutdown it checkpoints and raises, as spec §4 recommends. Once its
    first step is done it says so (progress "under way"), so a test can wait for progress to exist."""
    from taskq import CancelOrigin

    start = int(ctx.last_progress["step"]) if ctx.last_progress else 0
    for step in range(start, payload.steps):
        if ctx.cancellation_requested and ctx.cancel_origin is CancelOrigin.SHUTDOWN:
            await ctx.progress({"step": step}, message="interrupted by shutdown")
            raise asyncio.CancelledError
        if step == start + 1:
            await ctx.progress({"step": step}, message="under way")
        await asyncio.sleep(0.02)
    return {"resumed_from": start}


@actor(name="test.blocked_in_c")
def blocked_in_c(payload: float, ctx: JobContext[float]) -> float:
    """A thread actor stuck in one C call: an injected interrupt only lands when it returns."""
    time.sleep(payload)
    return payload


_hook_calls: list[str] = []


def _record_cancel(row: object) -> None:
    import os

    path = os.environ.get("TASKQ_TEST_HOOK_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"on_cancel {getattr(row, 'id', '?')}\n")


@actor(name="test.sleep_hooked", on_cancel=_record_cancel)
async def sleep_hooked(payload: Sleep, ctx: JobContext[Sleep]) -> dict[str, float]:
    """Attempt 1 sleeps `seconds` (a test can stop or cancel it then); later attempts return at once."""
    seconds = payload.seconds if ctx.attempt == 1 else 0.0
    await asyncio.sleep(seconds)
    return {"slept": seconds}


actors.extend([checkpointing, blocked_in_c, sleep_hooked, echo_fail])
