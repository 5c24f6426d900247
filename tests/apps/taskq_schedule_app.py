"""An APP mixing an actor and a schedule, for the scheduler's system tests and benchmark (imported by
worker and supervisor subprocesses via PYTHONPATH)."""

from __future__ import annotations

from datetime import timedelta

from taskq import JobContext, Schedule, actor


@actor(name="fleet.tick")
async def fleet_tick(payload: int, ctx: JobContext[int]) -> None:
    return None


app = [fleet_tick, Schedule(name="fleet-every-second", actor=fleet_tick, every=timedelta(seconds=1), payload=0)]


@actor(name="fleet.slot_in_child", isolation="process", max_attempts=1)
def slot_in_child(payload: int, ctx: JobContext[int]) -> str | None:
    """Runs in a child process: returns the nominal slot time the child's ctx sees."""
    return ctx.scheduled_for.isoformat() if ctx.scheduled_for is not None else None
