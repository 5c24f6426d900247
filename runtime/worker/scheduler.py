"""The scheduler: makes the slot jobs of the periodic schedules. Runs on every worker, with no leader:
a tick locks the due schedule rows with SKIP LOCKED, so concurrent schedulers share the work, and the
slot jobs and the move of each row's next slot commit together, so a slot is never made twice."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence

from taskq.backend.schedules import DueRead, Fire, ScheduleStore
from taskq.metrics import SCHEDULE_SLOTS, SCHEDULE_TICK
from taskq.schedules import Schedule, plan_tick

log = logging.getLogger("taskq.scheduler")

TICK_LIMIT = 500
"""Schedules one tick takes at most; a tick that got this many runs again at once."""
IDLE_POLL_INTERVAL = 10.0
"""Seconds between two looks while the table holds no enabled schedule: a schedule declared later is
fired by the worker that declares it (it runs a scheduler too) from its start, so nothing waits on
this; it only keeps an idle fleet's schedulers off the database."""
START_JITTER = 0.5
"""Seconds: the most the first tick after a worker starts waits."""
WAKE_MARGIN = 0.002
"""Seconds slept past a slot, so that the database's clock has reached it when the tick reads."""


def plan_fires(read: DueRead) -> list[Fire]:
    """The slots of every due schedule. A row this process cannot compute (a time zone missing from
    this host's zone data, an expression a newer taskq stored) is left out and logged: it stays due for
    a scheduler that can, and the other schedules go on."""
    fires = []
    for due in read.due:
        try:
            plan = plan_tick(due.spec, due.next_run_at, read.now, misfire=due.misfire,
                             max_catch_up=due.max_catch_up, misfire_grace=due.misfire_grace, overlap=due.overlap,
                             resumed_at=due.resumed_at)
        except Exception as exc:
            log.error("schedule %s: cannot compute its slots here (%s: %s); left to other schedulers",
                      due.name, type(exc).__name__, exc)
            continue
        fires.append(Fire(due.name, plan.slots, plan.missed, plan.next_run_at))
        if plan.missed:
            log.warning("schedule %s: %d slot(s) missed (misfire=%s)", due.name, plan.missed, due.misfire)
    return fires


class Scheduler:
    def __init__(self, store: ScheduleStore, schedules: Sequence[Schedule], *, owner: str,
                 poll_interval: float) -> None:
        self.store = store
        self.schedules = list(schedules)
        self.owner = owner
        self.poll_interval = poll_interval
        self.synced = asyncio.Event()

    async def run(self) -> None:
        """Tick until cancelled. The first tick waits a random part of the poll interval: a fleet that
        restarts together does not tick in step, and the worker's first claim is not kept waiting."""
        await asyncio.sleep(random.uniform(0.0, min(self.poll_interval, START_JITTER)))
        failures = 0
        while True:
            try:
                delay = await self.tick_once()
                failures = 0
            except Exception as exc:
                # the database is away: back off (the slots stay due; the first tick back makes them)
                failures += 1
                delay = min(self.poll_interval * 2 ** (failures - 1), IDLE_POLL_INTERVAL)
                log.warning("schedule tick failed (%d in a row, next try in %.1fs): %s", failures, delay, exc)
            await asyncio.sleep(delay)

    def stop(self) -> None:
        """Nothing to stop: due slots are fired until the exit (each fire is one transaction)."""

    async def sync(self) -> None:
        """Upsert the code declarations (at worker start, before the services run)."""
        outcome = await self.store.sync(self.schedules, self.owner)
        if outcome.created:
            log.info("schedules declared: %s", ", ".join(outcome.created))
        if outcome.changed:
            log.info("schedules whose slots changed (next slot moved): %s", ", ".join(outcome.changed))
        if outcome.disabled:
            log.warning("schedules of %s no longer declared, disabled (not deleted): %s",
                        self.owner, ", ".join(outcome.disabled))
        self.synced.set()

    async def tick_once(self) -> float:
        """One tick; returns the seconds to wait before the next one."""
        started = time.monotonic()
        read, fires, inserted = await self.store.tick(TICK_LIMIT, plan_fires)
        SCHEDULE_TICK.observe(time.monotonic() - started)
        if inserted:
            SCHEDULE_SLOTS.inc(inserted)
        if len(read.due) >= TICK_LIMIT:
            return 0.0
        wake = [t for t in (read.upcoming, *(f.next_run_at for f in fires)) if t is not None]
        if not wake:
            return self.poll_interval if read.any_enabled else max(self.poll_interval, IDLE_POLL_INTERVAL)
        until = (min(wake) - read.now).total_seconds() - (time.monotonic() - started) + WAKE_MARGIN
        return max(0.0, min(self.poll_interval, until))
