"""What a worker knows of queue control (pause, fleet-wide limits) for its queues, to choose its claims.

The claim statements never trust this view: job_claim itself leaves controlled queues and limited actors
alone, and job_claim_limited reads pause and limits under its locks. A stale view can only make a worker
claim limited work late (until the next NOTIFY on taskq_queues, or within one poll_interval), never take
what it must not.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from taskq.backend.workers import QueueControlRead, WorkerStore
from taskq.metrics import QUEUE_LIMIT, QUEUE_PAUSED

log = logging.getLogger("taskq.worker")


class QueueControl:
    def __init__(self, store: WorkerStore, queues: Sequence[str], refresh_every: float) -> None:
        self._store = store
        self._queues = list(dict.fromkeys(queues))
        self._refresh_every = refresh_every
        self._next_refresh = 0.0
        self.read = QueueControlRead()

    @property
    def limited(self) -> bool:
        """The limited claim may find work: one of our unpaused queues has limits, or some actor has."""
        if self.read.actor_limits:
            return len(self.read.paused) < len(self._queues)
        return any(lim.any for name, lim in self.read.queues.items() if name not in self.read.paused)

    @property
    def queue_limits_only(self) -> bool:
        """No actor limit and no per-key limit on our queues: the lighter limited claim will do."""
        return not self.read.actor_limits and all(
            lim.concurrency_per_key is None for lim in self.read.queues.values())

    @property
    def plain(self) -> bool:
        """The plain claim may find work: one of our queues is neither paused nor limited."""
        return any(
            name not in self.read.paused and not (name in self.read.queues and self.read.queues[name].any)
            for name in self._queues
        )

    def invalidate(self) -> None:
        """A NOTIFY said something changed: read again before the next claim."""
        self._next_refresh = 0.0

    async def refresh_if_due(self) -> None:
        # time.monotonic(), not the loop's clock: asyncio.get_running_loop() costs a system call on Python 3.11
        # (getpid), and this runs before every claim
        now = time.monotonic()
        if now < self._next_refresh:
            return
        # set before the read: a NOTIFY arriving during it invalidates again
        self._next_refresh = now + self._refresh_every
        read = await self._store.queue_control(self._queues)
        # jobs of fair queues written to start later take their place once due (sql/0016_fair_claims.sql)
        await self._store.fair_promote(self._queues)
        if read.paused != self.read.paused:
            log.info("paused queues of this worker: %s", sorted(read.paused) or "none")
        self.read = read
        for name in self._queues:
            QUEUE_PAUSED.labels(queue=name).set(1 if name in read.paused else 0)
            lim = read.queues.get(name)
            QUEUE_LIMIT.labels(queue=name, limit="concurrency").set(
                lim.concurrency if lim and lim.concurrency is not None else 0)
            QUEUE_LIMIT.labels(queue=name, limit="concurrency_per_key").set(
                lim.concurrency_per_key if lim and lim.concurrency_per_key is not None else 0)
            QUEUE_LIMIT.labels(queue=name, limit="rate").set(
                lim.rate_limit / lim.rate_period if lim and lim.rate_limit and lim.rate_period else 0)
