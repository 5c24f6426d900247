"""The resolver: settles the dependency backlog, the edges a parent's terminal transaction left beyond its
chunk (migration 11). Runs on every worker, beside the sweeper: woken by NOTIFY taskq_settle (the
listener), polling every `sweep_interval` besides (`poll_interval` without a LISTEN connection), and once
at start, so a backlog left by a crash, or written while no worker ran, is taken up by the next worker.
Each step settles one backlog slice (at most one chunk of edges) in one transaction; SKIP LOCKED on the
slices keeps concurrent steps apart, and a step killed midway rolls back and leaves its slice to the next
one. An empty backlog costs one short statement per wake."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.backend.workers import WorkerStore

log = logging.getLogger("taskq.resolver")

SETTLE_CHANNEL = "taskq_settle"
SLICES_PER_STEP = 1
"""Backlog slices one step takes (each is at most one chunk of edges)."""
STEPS_AT_ONCE = 2
"""Steps one worker runs in parallel, each on its own connection: the slices of one big fan-out are
settled side by side (the database does the work; one step alone leaves a core idle)."""


class Resolver:
    """`interval`: seconds between polls. The NOTIFY wakes it at once; the poll only catches a backlog left
    by a crash, so the worker makes it as slow as the sweeper's unless no LISTEN connection is there to
    wake it."""

    def __init__(self, store: WorkerStore, *, interval: float) -> None:
        self._store = store
        self._interval = interval
        self.wake = asyncio.Event()
        self.fallback: tuple[Callable[[], bool], float] | None = None
        """(listening, interval): while `listening()` is false (the LISTEN connection is down), poll every
        `interval` instead, as a worker without LISTEN does."""

    async def run(self) -> None:
        while True:
            interval = self._interval
            if self.fallback is not None and not self.fallback[0]():
                interval = min(interval, self.fallback[1])
            self.wake.clear()
            try:
                await self.resolve_once()
            except Exception as exc:
                log.warning("dependency resolution failed: %s", exc)
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=interval)
            except TimeoutError:
                pass

    def stop(self) -> None:
        """Nothing to stop: the backlog is settled until the exit."""

    async def resolve_once(self) -> int:
        """Steps until the backlog is empty (or held by other resolvers); returns the steps that took rows."""
        if not await self._store.settle_backlog(slices=SLICES_PER_STEP):
            return 0  # the usual case: one short statement on one connection
        steps = 1 + sum(await asyncio.gather(*(self._steps() for _ in range(STEPS_AT_ONCE))))
        if steps:
            log.debug("resolver: %d steps", steps)
        return steps

    async def _steps(self) -> int:
        steps = 0
        while await self._store.settle_backlog(slices=SLICES_PER_STEP):
            steps += 1
        return steps
