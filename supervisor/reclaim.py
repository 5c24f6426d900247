"""Handing a dead worker's leases to the crash-reclaim path at once, with bounded retries.

The supervisor learns of a death from waitpid() long before the worker's leases expire. Reclaiming
then (job_reclaim with its worker id: the sweeper's verdicts and fences, without waiting for lock_timeout)
gets the jobs retried in about a second instead of a lease length. When the database is unreachable
the attempt is retried with backoff until lock_timeout has passed; after that the lock-expiry sweeper
of any worker recovers the rows anyway.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from taskq.backend.supervisor import reclaim_dead_worker

log = logging.getLogger("taskq.supervisor")


@dataclass
class PendingReclaim:
    worker_id: str
    cause: str
    detail: str
    give_up_at: float
    next_try: float


class Reclaimer:
    """Reclaims now when it can; after a failure, waits (with backoff) before touching the database
    again, so a database outage during a stop costs one connect timeout, not one per dead worker."""

    def __init__(self, dsn: str, reclaimer_id: str, *, give_up_after: float) -> None:
        self.dsn = dsn
        self.reclaimer_id = reclaimer_id
        self.give_up_after = give_up_after
        self.pending: list[PendingReclaim] = []
        self._quiet_until = 0.0
        self._delay = 1.0

    def reclaim(self, worker_id: str, cause: str, detail: str, now: float) -> None:
        """`cause`: 'worker_died' (waitpid saw it) or 'heartbeat_timeout' (we killed it for silence)."""
        self.pending.append(PendingReclaim(worker_id, cause, detail, give_up_at=now + self.give_up_after,
                                           next_try=now))
        self.retry_due(now)

    def retry_due(self, now: float) -> None:
        if now < self._quiet_until:
            return
        for job in [p for p in self.pending if p.next_try <= now]:
            if not self._attempt(job, now):
                return

    def flush(self, now: float) -> None:
        """One last try for everything pending (the supervisor is exiting); stops at the first failure."""
        self._quiet_until = 0.0
        for job in self.pending:
            job.next_try = job.give_up_at = now
        self.retry_due(now)
        for job in self.pending:
            log.error("could not reclaim the jobs of worker %s: the lock-expiry sweeper recovers them",
                      job.worker_id)
        self.pending.clear()

    def next_try(self) -> float | None:
        due = min((p.next_try for p in self.pending), default=None)
        return None if due is None else max(due, self._quiet_until)

    def _attempt(self, job: PendingReclaim, now: float) -> bool:
        try:
            counts = reclaim_dead_worker(self.dsn, job.worker_id, cause=job.cause, detail=job.detail,
                                         reclaimer_id=self.reclaimer_id)
        except Exception as exc:
            self._quiet_until = now + self._delay
            for p in self.pending:
                p.next_try = max(p.next_try, self._quiet_until)
            dropped = [p for p in self.pending if p.give_up_at <= self._quiet_until]
            for p in dropped:
                self.pending.remove(p)
                log.error("giving up reclaiming the jobs of worker %s (%s): the lock-expiry sweeper recovers "
                          "them", p.worker_id, exc)
            if self.pending:
                log.warning("could not reclaim the jobs of %d dead workers yet (%s); retrying in %.0fs",
                            len(self.pending), exc, self._delay)
            self._delay = min(self._delay * 2, 10.0)
            return False
        self.pending.remove(job)
        self._delay = 1.0
        if counts:
            log.warning("reclaimed the jobs of dead worker %s (%s): %s", job.worker_id, job.cause, counts)
        return True
