"""The enqueue NOTIFY, coalesced per queue within a short window (part of the SQL layer, split from
backend.py by noun).

Every transaction that calls pg_notify takes PostgreSQL's one notify lock at commit and holds it through
its WAL flush, so notifying commits from many sessions run one at a time: measured with 8 producers
inserting one job per commit, the NOTIFY halved enqueue throughput (benchmarks/notify.py). A worker needs
one wake-up per burst, not one per job. So a client process notifies inline, in the insert itself, only
the first job of a queue in each `window`; a job enqueued within the window of the last NOTIFY writes
none and, once its insert has committed, makes sure one more NOTIFY follows when the window ends: a
statement of its own, which writes no WAL and so holds the lock only for an instant. At light load (jobs
further apart than the window) every job still notifies inline, and enqueue -> start is unchanged; in a
burst, the last jobs wait at most one window for their wake-up (and a worker busy with the burst claims
them anyway). Jobs enqueued in the caller's own transaction always notify inline: only that transaction
knows when it commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from taskq import sql

log = logging.getLogger("taskq.client")

NOTIFY_WINDOW = 0.01
"""Seconds: at most one inline NOTIFY per queue per window from one client process. Below the 20 ms
between jobs at 50 jobs/s, the light load at which enqueue -> start latency is measured."""


class _Trailing:
    __slots__ = ("sending", "task")

    def __init__(self) -> None:
        self.sending = False
        self.task: asyncio.Task[None] | None = None


class EnqueueNotifier:
    """Which inserts notify inline, and the trailing NOTIFY of the ones that did not."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[Any]], window: float = NOTIFY_WINDOW) -> None:
        self.pool = pool
        self.window = window
        self._last: dict[str, float] = {}
        self._trailing: dict[str, _Trailing] = {}

    def inline(self, queue: str) -> bool:
        """True: this insert notifies itself, and a new window starts. False: it does not; call
        `after_commit(queue)` once it has committed."""
        if self.window <= 0:
            return True
        now = time.monotonic()
        if now - self._last.get(queue, -self.window) >= self.window:
            self._last[queue] = now
            return True
        return False

    def after_commit(self, queue: str) -> None:
        """A job of `queue` committed without a NOTIFY: one follows by the end of the window. A trailing
        NOTIFY already waiting to be sent covers this job too (it is sent after this commit); one already
        on its way may have been sent before it, so another is scheduled."""
        pending = self._trailing.get(queue)
        if pending is not None and not pending.sending:
            return
        trailing = _Trailing()
        self._trailing[queue] = trailing
        trailing.task = asyncio.get_running_loop().create_task(self._send(queue, trailing), name="taskq-notify")

    async def _send(self, queue: str, trailing: _Trailing) -> None:
        try:
            delay = self._last.get(queue, 0.0) + self.window - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            trailing.sending = True
            await self._notify_now(queue)
        finally:
            if self._trailing.get(queue) is trailing:
                del self._trailing[queue]

    async def _notify_now(self, queue: str) -> None:
        try:
            async with self.pool.connection() as conn:
                await conn.execute(sql.query("jobs_notify"), {"queue": queue})
            self._last[queue] = time.monotonic()
        except Exception as exc:  # the workers' polling finds the jobs all the same
            log.warning("could not send the NOTIFY for queue %r (workers find its jobs by polling): %s", queue, exc)

    async def flush(self, timeout: float = 5.0) -> None:
        """Send the trailing NOTIFYs still waiting, now: the pool is about to close."""
        for queue, trailing in list(self._trailing.items()):
            task = trailing.task
            if task is None:
                continue
            if not trailing.sending:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await asyncio.wait_for(self._notify_now(queue), timeout)
            else:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(task, timeout)
