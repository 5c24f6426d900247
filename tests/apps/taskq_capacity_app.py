"""Actors for the capacity-per-isolation-class tests (tests/system/test_isolation_capacity.py): an async
nap and a process actor that writes down when it started, so that a test can tell a process job that was
claimed and then left waiting for a child from one that ran at once. Worker subprocesses import this
module as `taskq_capacity_app` (their PYTHONPATH is tests/apps)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from pydantic import BaseModel

from taskq import JobContext, actor


class Nap(BaseModel):
    seconds: float


@actor(name="cap.nap")
async def nap(payload: Nap) -> float:
    await asyncio.sleep(payload.seconds)
    return payload.seconds


class Crunch(BaseModel):
    seconds: float
    started: str
    """A directory: the actor writes the wall-clock time it started into `<started>/<job id>`."""


@actor(name="cap.crunch", isolation="process")
def crunch(payload: Crunch, ctx: JobContext[Crunch]) -> int:
    Path(payload.started, str(ctx.job_id)).write_text(repr(time.time()))
    deadline = time.monotonic() + payload.seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
    return n


actors = [nap, crunch]
