"""An APP mixing an actor and a schedule, for the scheduler's system tests and benchmark (imported by
worker and supervisor subprocesses via PYTHONPATH)."""

from __future__ import annotations

from datetime import timedelta

from taskq import JobContext, Schedule, actor


@actor(name="fleet.tick")
async def fleet_tick(payload: int, ctx: JobContext[int]) -> None:
    return None


app = [fleet_tick, Schedule(name="fleet-every-second", actor=fleet_tick, every=timedelta(seconds=1), payload=0)]
