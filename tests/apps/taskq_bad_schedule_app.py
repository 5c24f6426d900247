"""An APP whose schedule declaration is invalid: importing it raises ScheduleDefinitionError, so a worker
exits at boot with its import-error code (10) and one line naming the schedule and the expression."""

from __future__ import annotations

from taskq import JobContext, Schedule, actor


@actor(name="broken.tick")
async def tick(payload: int, ctx: JobContext[int]) -> None:
    return None


app = [tick, Schedule(name="broken", actor=tick, cron="61 25 * * *", payload=0)]
