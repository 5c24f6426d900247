"""Actors for the supervisor's system tests: everything in taskq_testapp, plus actors that break the
worker process itself (imported by supervisor subprocesses via PYTHONPATH)."""

from __future__ import annotations

import os
import time

from taskq_testapp import actors as _base_actors

from taskq import JobContext, actor


@actor(name="test.block_loop", max_attempts=1)
async def block_loop(payload: float, ctx: JobContext[float]) -> float:
    """Blocks the worker's event loop (a sync sleep inside async def): its liveness reports stop."""
    time.sleep(payload)  # noqa: ASYNC251 - blocking the loop is the point
    return payload


@actor(name="test.kill_worker", max_attempts=10)
async def kill_worker(payload: int, ctx: JobContext[int]) -> int:
    """Ends the whole worker process at once with exit code `payload`."""
    os._exit(payload)


actors = [*_base_actors, block_loop, kill_worker]
