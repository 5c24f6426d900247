"""The pruner: every `prune_interval` (with jitter), delete the terminal jobs, events and attempts rows,
and the web API's idempotency receipts and audit rows, past their retention windows, through the one
prune service `taskq prune` also uses. Runs on every worker; the batches lock with SKIP LOCKED, so
pruners on many workers share the work without waiting on one another, and each uses a connection of
its own for the length of one prune, never the pool's."""

from __future__ import annotations

import asyncio
import logging
import random

from taskq.backend.workers import WorkerStore
from taskq.metrics import ROWS_PRUNED
from taskq.models import PruneResult
from taskq.ops.retention import keep_windows, prune
from taskq.settings import WorkerSettings

log = logging.getLogger("taskq.pruner")


class Pruner:
    def __init__(self, store: WorkerStore, settings: WorkerSettings) -> None:
        self.store = store
        self.settings = settings
        self.stopping = asyncio.Event()
        """Set by the worker's shutdown: a prune in progress ends after its current batch."""

    @property
    def enabled(self) -> bool:
        return any(v > 0 for v in keep_windows(self.settings).values())

    async def run(self) -> None:
        if not self.enabled:
            await self.stopping.wait()
            return
        interval = self.settings.prune_interval
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self.stopping.wait(), interval * random.uniform(0.9, 1.1))
                return
            except TimeoutError:
                pass
            try:
                await self.prune_once()
            except Exception as exc:
                log.warning("prune failed: %s", exc)

    def stop(self) -> None:
        """A prune in progress ends after its current batch; no new one starts."""
        self.stopping.set()

    async def prune_once(self) -> PruneResult:
        result = await prune(self.store.backend, keep_windows(self.settings), stop=self.stopping)
        for cls in ("succeeded", "failed", "attempts", "receipts", "audit", "events"):
            n = getattr(result, cls)
            if n:
                ROWS_PRUNED.labels(**{"class": cls}).inc(n)
        if result.total:
            log.info("pruned %d succeeded, %d failed jobs (%d events), %d attempts rows, %d receipts, %d audit rows"
                     " in %.2fs", result.succeeded, result.failed, result.events, result.attempts, result.receipts,
                     result.audit, result.seconds)
        return result
