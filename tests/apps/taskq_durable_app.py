"""Actors for the durable-job system tests (tests/system/test_durable_processes.py): a job of N steps in each
isolation class. Every step records its execution in public.durable_effects (job, step, attempt) just before
it returns, and the step named in `block_at` first records that it was entered (step 'enter-<name>') and then,
on the first attempt only, waits for the file `gate` to exist (a test kills, stops or restarts the worker
meanwhile)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel

from taskq import JobContext, actor

EFFECTS_DDL = "CREATE TABLE IF NOT EXISTS public.durable_effects (job_id uuid, step text, attempt int)"


class Steps(BaseModel):
    steps: int = 4
    block_at: int | None = None
    gate: str | None = None
    step_seconds: float = 0.0


def record(job_id: Any, step: str, attempt: int) -> None:
    with psycopg.connect(os.environ["TASKQ_DSN"], autocommit=True) as conn:
        conn.execute("INSERT INTO public.durable_effects VALUES (%s, %s, %s)", (job_id, step, attempt))


def wait_for_gate(gate: str) -> None:
    while not Path(gate).exists():
        time.sleep(0.02)


def run_step(payload: Steps, job_id: Any, attempt: int, n: int) -> int:
    if payload.step_seconds:
        time.sleep(payload.step_seconds)
    if n == payload.block_at:
        record(job_id, f"enter-{n}", attempt)
        if attempt == 1 and payload.gate is not None:
            wait_for_gate(payload.gate)
    record(job_id, str(n), attempt)
    return n * 10


@actor(name="durable.async", max_attempts=5)
async def steps_async(payload: Steps, ctx: JobContext[Steps]) -> list[int]:
    out = []
    for n in range(1, payload.steps + 1):
        # a blocking step runs in a thread, so the worker's loop (heartbeats, cancels) keeps going
        out.append(await ctx.step(str(n), asyncio.to_thread, run_step, payload, ctx.job_id, ctx.attempt, n))
    return out


@actor(name="durable.thread", max_attempts=5, isolation="thread")
def steps_thread(payload: Steps, ctx: JobContext[Steps]) -> list[int]:
    return [ctx.step(str(n), run_step, payload, ctx.job_id, ctx.attempt, n) for n in range(1, payload.steps + 1)]


@actor(name="durable.process", max_attempts=5, isolation="process")
def steps_process(payload: Steps, ctx: Any) -> list[int]:
    return [ctx.step(str(n), run_step, payload, ctx.job_id, ctx.attempt, n) for n in range(1, payload.steps + 1)]


@actor(name="durable.tx", max_attempts=5)
async def in_transaction(payload: Steps, ctx: JobContext[Steps]) -> int:
    """Writes a row in ctx.transaction(); with `gate`, the first attempt waits inside the block."""
    async with ctx.transaction() as conn:
        await conn.execute("INSERT INTO public.durable_effects VALUES (%s, 'tx', %s)", (ctx.job_id, ctx.attempt))
        record(ctx.job_id, "enter-tx", ctx.attempt)
        if ctx.attempt == 1 and payload.gate is not None:
            await asyncio.to_thread(wait_for_gate, payload.gate)
    return ctx.attempt


@actor(name="durable.process_suspends", max_attempts=1, isolation="process")
def process_suspends(payload: Steps, ctx: Any) -> list[Any]:
    """A process actor that steps, sleeps and waits for a signal: the suspensions are the worker's."""
    first = ctx.step("first", run_step, payload, ctx.job_id, ctx.attempt, 1)
    ctx.sleep(0.5)
    got = ctx.wait_for_signal("go")
    return [first, got, ctx.attempt]


@actor(name="durable.thread_suspends", max_attempts=1, isolation="thread")
def thread_suspends(payload: Steps, ctx: JobContext[Steps]) -> list[Any]:
    first = ctx.step("first", run_step, payload, ctx.job_id, ctx.attempt, 1)
    ctx.sleep(0.5)
    got = ctx.wait_for_signal("go")
    return [first, got, ctx.attempt]


actors = [steps_async, steps_thread, steps_process, in_transaction, process_suspends, thread_suspends]
