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
    from taskq.backend.workers import WorkerStore
    from taskq.worker.registry import ActiveJobRegistry

log = logging.getLogger("taskq.sweeper")

SWEEP_BATCH = 500


class Sweeper:
    """Sweeps every `sweep_interval` seconds (jittered); a workers row silent for `dead_after` seconds is
    cleaned. The rows this worker holds (`registry`) are never swept as lost."""

    def __init__(self, store: WorkerStore, registry: ActiveJobRegistry, *, sweep_interval: float,
                 dead_after: float) -> None:
        self._store = store
        self._registry = registry
        self._sweep_interval = sweep_interval
        self._dead_after = dead_after

    async def run(self) -> None:
        interval = self._sweep_interval
        while True:
            await asyncio.sleep(interval * random.uniform(0.9, 1.1))
            try:
                await self.sweep_once()
            except Exception as exc:
                log.warning("sweep failed: %s", exc)

    def stop(self) -> None:
        """Nothing to stop: a sweep during the stop reclaims rows as well as any other."""

    async def sweep_once(self) -> dict[str, int]:
        total: dict[str, int] = {}
        while True:
            counts = await self._store.sweep_expired([e.id for e in self._registry], limit=SWEEP_BATCH)
            for verdict, n in counts.items():
                total[verdict] = total.get(verdict, 0) + n
                JOBS_SWEPT.labels(verdict=verdict).inc(n)
            if sum(counts.values()) < SWEEP_BATCH:
                break
        late = await self._store.sweep_deadlines(limit=SWEEP_BATCH)
        if late:
            total["deadline"] = late
            JOBS_SWEPT.labels(verdict="deadline").inc(late)
        if total:
            log.info("sweeper reclaimed %s", total)
        await self._store.clean_dead_workers(self._dead_after)
        return total
