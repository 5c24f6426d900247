"""The sweeper: reclaims rows whose lease expired (dead or frozen workers), its own worker's rows that
worker lost track of, and rows past their schedule_to_close. Runs on every worker; SKIP LOCKED makes
concurrent sweeps safe."""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

from taskq.metrics import JOBS_SWEPT

if TYPE_CHECKING:
    from taskq.worker.main import Worker

log = logging.getLogger("taskq.sweeper")

SWEEP_BATCH = 500


class Sweeper:
    def __init__(self, worker: Worker) -> None:
        self.w = worker

    async def run(self) -> None:
        interval = self.w.settings.sweep_interval
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                await self.sweep_once()
            except Exception as exc:
                log.warning("sweep failed: %s", exc)

    async def sweep_once(self) -> dict[str, int]:
        total: dict[str, int] = {}
        while True:
            counts = await self.w.store.sweep_expired([e.id for e in self.w.registry], limit=SWEEP_BATCH)
            for verdict, n in counts.items():
                total[verdict] = total.get(verdict, 0) + n
                JOBS_SWEPT.labels(verdict=verdict).inc(n)
            if sum(counts.values()) < SWEEP_BATCH:
                break
        late = await self.w.store.sweep_deadlines(limit=SWEEP_BATCH)
        if late:
            total["deadline"] = late
            JOBS_SWEPT.labels(verdict="deadline").inc(late)
        if total:
            log.info("sweeper reclaimed %s", total)
        s = self.w.settings
        await self.w.store.clean_dead_workers(max(2 * s.lock_timeout, 10 * s.heartbeat_interval, 60.0))
        return total
