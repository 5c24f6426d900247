"""APPs for benchmarks/schedules.py: many schedules of a no-op actor, every few seconds.

Worker subprocesses import `benchmarks.schedule_apps:app` (or `:idle` for the same worker with no
schedule). The count, interval and queue come from the environment the benchmark sets, so that every
worker of a round declares exactly the same schedules.
"""

from __future__ import annotations

import os
from datetime import timedelta

from taskq import Schedule
from taskq.actors.declaration import ActorRegistry, actor

COUNT = int(os.environ.get("TASKQ_BENCH_SCHEDULES", "1000"))
EVERY = int(os.environ.get("TASKQ_BENCH_EVERY", "10"))
QUEUE = os.environ.get("TASKQ_BENCH_SLOT_QUEUE", "bench-slots")

app = ActorRegistry(owner="bench-schedules")
idle = ActorRegistry(owner="bench-idle")


@actor(name="bench.slot", queue=QUEUE, registry=app)
async def slot(payload: int) -> None:
    return None


idle.register(slot)
for i in range(COUNT):
    app.add(Schedule(name=f"bench-{i:05d}", actor=slot, every=timedelta(seconds=EVERY), payload=i, queue=QUEUE))
