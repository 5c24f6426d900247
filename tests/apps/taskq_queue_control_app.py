"""Actors of the queue-control system tests: short jobs, and actors with fleet-wide limits."""

from __future__ import annotations

import asyncio

from taskq import JobContext, actor
from taskq.actors.declaration import ActorRegistry

registry = ActorRegistry()


@actor(name="qc.short", queue="limited", registry=registry)
async def short(payload: float, ctx: JobContext[float]) -> None:
    await asyncio.sleep(payload)


@actor(name="qc.tenant", queue="tenants", concurrency_per_key=2, registry=registry)
async def tenant(payload: float, ctx: JobContext[float]) -> None:
    await asyncio.sleep(payload)


@actor(name="qc.rated", queue="rated", rate_limit=50, rate_period=1.0, registry=registry)
async def rated(payload: int, ctx: JobContext[int]) -> int:
    return payload


@actor(name="qc.held", queue="held", global_concurrency=3, max_attempts=5, registry=registry)
async def held(payload: float, ctx: JobContext[float]) -> None:
    await asyncio.sleep(payload)


@actor(name="qc.drain", queue="drain", registry=registry)
async def drain(payload: float, ctx: JobContext[float]) -> None:
    await asyncio.sleep(payload)


actors = registry
