"""The enqueue NOTIFY, sent after the insert commits, coalesced per queue within a short window (part
of the SQL layer, split from backend.py by noun).

A transaction that called pg_notify takes PostgreSQL's one notify lock at commit and holds it until its
commit is over, WAL flush included, so notifying commits from many sessions run one at a time; the
flush of every notifying enqueue queued behind the flush of the one before (benchmarks/notify.py: 8
producers, the enqueues waiting on `Lock:object`). So an enqueue through the client's own pool writes
no NOTIFY: once its insert has committed, the client sends one in a transaction of its own that writes
nothing else, so PostgreSQL does not flush WAL for it and holds the notify lock only for an instant.
At light load (no job of that queue went in from this process in the last `window`) the insert
carries the NOTIFY itself after all: there is no convoy to avoid, and PostgreSQL delivers it with the
commit, one statement sooner (enqueue -> start is then what it was before coalescing). Otherwise that
NOTIFY goes at once, on the insert's own connection before the enqueue returns, when none of that
queue was sent in the last `window`; within the window one trailing NOTIFY goes when it ends (a task of
the event loop sends it on a pooled connection; the enqueue does not wait for it), and covers every job
committed before it is sent. So a worker hears of a job at most one window plus a round trip after its
commit, and one process sends at most one NOTIFY per queue per window however many tasks enqueue.

If the process dies between the commit and the NOTIFY, or the NOTIFY fails, no notification comes:
the workers' poll (`poll_interval`) finds the job. Jobs enqueued in the caller's own transaction
(`connection=`) notify in that transaction, as before: only it knows when it commits, and PostgreSQL
delivers the notification at that commit and not before.
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
"""Seconds: at most one NOTIFY per queue per window from one client process; a NOTIFY is late by at most
this much. Below the 20 ms between jobs at 50 jobs/s, the light load at which enqueue -> start latency
is measured, so there every job gets its own NOTIFY at once."""


def quiet_insert(seen: dict[str, float], last: dict[str, float], queue: str, window: float, pending: bool) -> bool:
    """The light-load rule both notifiers share (this module's and the sync client's, which calls it under
    its lock): True when this process inserted no job of `queue` in the last `window` and no NOTIFY of it
    is waiting (`pending`) or went in the last window. Then the insert notifies in its own transaction:
    PostgreSQL delivers the NOTIFY with the insert's commit, with no second statement, so enqueue -> start
    at light load is what it was before coalescing; and a window starts. A busy queue's inserts (another
    within the window) never notify in their transaction: notifying commits stay few. Records the insert."""
    now = time.monotonic()
    before = seen.get(queue, -window)
    seen[queue] = now
    if pending or now - before < window or now - last.get(queue, -window) < window:
        return False
    last[queue] = now
    return True


class _Trailing:
    __slots__ = ("sending", "task")

    def __init__(self) -> None:
        self.sending = False
        self.task: asyncio.Task[None] | None = None


class EnqueueNotifier:
    """The NOTIFYs of the inserts that committed without one."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[Any]], window: float = NOTIFY_WINDOW) -> None:
        self.pool = pool
        self.window = window
        self.in_transaction = False
        """True: every insert notifies in its own transaction (as taskq did before; for comparisons)."""
        self._last: dict[str, float] = {}
        self._seen: dict[str, float] = {}  # queue -> when this process last inserted one of its jobs
        self._trailing: dict[str, _Trailing] = {}

    def inline(self, queue: str) -> bool:
        """True: this insert notifies in its own transaction. False: call `after_commit(queue)` once it
        has committed."""
        return self.in_transaction

    def quiet(self, queue: str) -> bool:
        """True: this insert carries its own NOTIFY (see `quiet_insert`); call before the insert."""
        return not self.in_transaction and quiet_insert(self._seen, self._last, queue, self.window,
                                                        queue in self._trailing)

    def send_now(self, queue: str) -> bool:
        """True: no NOTIFY of `queue` went in the last window and none is waiting, so the caller sends one
        now with `send_on`, on the connection its insert has just committed on (no other connection to
        wake, no hop through the event loop), and a window starts. False: call `after_commit(queue)`."""
        if self.in_transaction or queue in self._trailing:
            return False
        now = time.monotonic()
        if now - self._last.get(queue, -self.window) < self.window:
            return False
        self._last[queue] = now
        return True

    async def send_on(self, conn: AsyncConnection[Any], queue: str) -> None:
        """The NOTIFY `send_now` allowed. Its insert has committed: a failure here is logged, not raised
        (the workers' polling finds the job)."""
        try:
            await conn.execute(sql.query("jobs_notify"), {"queue": queue})
        except Exception as exc:
            log.warning("could not send the NOTIFY for queue %r (workers find its jobs by polling): %s", queue, exc)

    def after_commit(self, queue: str) -> None:
        """A job of `queue` committed without a NOTIFY: one follows, at once or by the end of the window.
        One waiting to be sent covers this job too (it is sent after this commit); one already on its
        way may have been sent before it, so another is scheduled."""
        pending = self._trailing.get(queue)
        if pending is not None and not pending.sending:
            return
        trailing = _Trailing()
        self._trailing[queue] = trailing
        trailing.task = asyncio.get_running_loop().create_task(self._send(queue, trailing), name="taskq-notify")

    async def _send(self, queue: str, trailing: _Trailing) -> None:
        try:
            delay = self._last.get(queue, -self.window) + self.window - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            trailing.sending = True
            self._last[queue] = time.monotonic()  # the next one waits a window from this one's start
            await self._notify_now(queue)
        finally:
            if self._trailing.get(queue) is trailing:
                del self._trailing[queue]

    async def _notify_now(self, queue: str) -> None:
        try:
            # getconn/putconn rather than pool.connection(), whose exit issues a no-op commit
            conn = await self.pool.getconn()
            try:
                await conn.execute(sql.query("jobs_notify"), {"queue": queue})
            finally:
                await self.pool.putconn(conn)
        except Exception as exc:  # the workers' polling finds the jobs all the same
            log.warning("could not send the NOTIFY for queue %r (workers find its jobs by polling): %s", queue, exc)

    async def flush(self, timeout: float = 5.0) -> None:
        """Send the NOTIFYs still waiting, now, and wait for those on their way: the pool is about to close."""
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
