"""The enqueue NOTIFY, sent after the insert commits, coalesced per queue within a window that widens
while the queue stays busy (part of the SQL layer, split from backend.py by noun).

A transaction that called pg_notify takes PostgreSQL's one notify lock at commit and holds it until its
commit is over, WAL flush included, so notifying commits from many sessions run one at a time; the
flush of every notifying enqueue queued behind the flush of the one before (benchmarks/notify.py: 8
producers, the enqueues waiting on `Lock:object`). So an enqueue through the client's own pool writes
no NOTIFY: once its insert has committed, the client sends one in a transaction of its own that writes
nothing else, so PostgreSQL does not flush WAL for it and holds the notify lock only for an instant.

`NotifyPacing` decides, per queue and per process, which insert gets a NOTIFY and when:
- **Quiet** (this process's last two inserts of that queue each came at least `window`, 10 ms, after
  the one before, or a pause of `max_window` ended): the insert carries the NOTIFY itself. There is no
  convoy to avoid, and PostgreSQL delivers it with the commit, one statement sooner, so enqueue -> start
  at light load is what it was before coalescing.
- **Busy**: the NOTIFY goes at once, on the insert's own connection before the enqueue returns, when
  none of that queue went in the current window; within the window, one trailing NOTIFY goes when it
  ends (a task of the event loop, or the sync client's thread, sends it on a pooled connection; the
  enqueue does not wait for it), and covers every job committed before it is sent.
- Every NOTIFY a busy queue sends doubles its window, up to `max_window` (100 ms); a quiet insert brings
  it back to `window`. A short burst is heard within 10 ms; a process that enqueues without pause sends
  at most 10 NOTIFYs a second per queue, however fast it enqueues. Each NOTIFY costs the producer a
  statement, PostgreSQL a notifying commit and a signal to every listener, and every idle worker a
  wake-up and a claim; at 8 producers, one NOTIFY per 10 ms each cost a quarter of the enqueue
  throughput, and one per 50 ms each still 11 % of the sync client's (benchmarks/notify.py). So a
  worker hears of a job at most `max_window` plus a round trip after its commit (a worker already taking
  a busy queue's jobs does not wait for it: worker/dispatcher.py BUSY_POLL), and at light load at once.

If the process dies between the commit and the NOTIFY, or the NOTIFY fails, no notification comes:
the workers' poll (`poll_interval`) finds the job. Jobs enqueued in the caller's own transaction
(`connection=`) notify in that transaction, as before: only it knows when it commits, and PostgreSQL
delivers the notification at that commit and not before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from taskq import sql
from taskq.backend._conn import LISTENER_APPLICATION_NAME, keepalive_kwargs

log = logging.getLogger("taskq.client")

NOTIFY_WINDOW = 0.01
"""Seconds: the quiet gap (an insert after this long without one of its queue carries its own NOTIFY) and a
busy queue's first coalescing window. Below the 20 ms between jobs at 50 jobs/s, the light load at which
enqueue -> start latency is measured, so there every job gets its own NOTIFY at once."""

NOTIFY_WINDOW_MAX = 0.1
"""Seconds: the widest a busy queue's coalescing window grows (it doubles with each NOTIFY it sends), so
the longest a worker waits to hear of a job beyond its commit while one process enqueues without pause."""


class NotifyPacing:
    """Which insert of one process gets a NOTIFY, and when (the module docstring says why). Shared by both
    notifiers (the sync client's calls it under its lock). Times are time.monotonic()."""

    def __init__(self, window: float = NOTIFY_WINDOW, max_window: float = NOTIFY_WINDOW_MAX) -> None:
        self.window = window
        self.max_window = max_window
        self._seen: dict[str, float] = {}  # queue -> when this process last inserted one of its jobs
        self._last: dict[str, float] = {}  # queue -> when its last NOTIFY went
        self._span: dict[str, float] = {}  # queue -> its current window, while busy
        self._gap: dict[str, float] = {}  # queue -> the time between its last two inserts

    def quiet(self, queue: str) -> bool:
        """Call before each insert of `queue`. True when the queue is quiet in this process: this insert
        comes at least `window` after the one before, and so did that one, or it ends a pause of at least
        `max_window`. Then the insert notifies in its own transaction (PostgreSQL delivers that NOTIFY with
        its commit, no second statement), and the queue's window narrows back to `window`. A busy
        queue's inserts never notify in their transaction: notifying commits stay few. Two gaps, not one,
        because a producer that enqueues without pause on a loaded machine still sees one gap in a few
        longer than 10 ms."""
        now = time.monotonic()
        before = self._seen.get(queue)
        self._seen[queue] = now
        gap = math.inf if before is None else now - before
        previous, self._gap[queue] = self._gap.get(queue, math.inf), gap
        if gap < self.window or (previous < self.window and gap < self.widest()):
            return False
        self._last[queue] = now
        self._span.pop(queue, None)
        return True

    def widest(self) -> float:
        """`max_window`, or `window` if that is wider (a test may set a long `window` alone)."""
        return max(self.max_window, self.window)

    def span(self, queue: str) -> float:
        """The queue's current window: at least `window`, widened by each busy NOTIFY up to `max_window`."""
        return max(self._span.get(queue, self.window), self.window)

    def due(self, queue: str) -> float:
        """When the next NOTIFY of `queue` may go: its last one plus its current window."""
        return self._last.get(queue, -math.inf) + self.span(queue)

    def send_now(self, queue: str, pending: bool) -> bool:
        """Call after a busy insert committed. True: no NOTIFY of it is waiting (`pending`) or went in its
        current window, so the caller sends one now, and that counts as sent (`sent`). False: one is due
        at `due(queue)`."""
        now = time.monotonic()
        if pending or now < self.due(queue):
            return False
        self.sent(queue, now)
        return True

    def sent(self, queue: str, at: float) -> None:
        """A busy queue's NOTIFY went at `at`: the next waits one window from it, and the window doubles."""
        self._last[queue] = at
        self._span[queue] = min(2 * self.span(queue), self.widest())


class _Trailing:
    __slots__ = ("sending", "task")

    def __init__(self) -> None:
        self.sending = False
        self.task: asyncio.Task[None] | None = None


class EnqueueNotifier:
    """The NOTIFYs of the inserts that committed without one."""

    def __init__(self, pool: AsyncConnectionPool[AsyncConnection[Any]], window: float = NOTIFY_WINDOW) -> None:
        self.pool = pool
        self.pacing = NotifyPacing(window)
        self.in_transaction = False
        """True: every insert notifies in its own transaction (as taskq did before; for comparisons)."""
        self._trailing: dict[str, _Trailing] = {}

    @property
    def window(self) -> float:
        """The quiet gap and a busy queue's first window (NotifyPacing.window)."""
        return self.pacing.window

    @window.setter
    def window(self, seconds: float) -> None:
        self.pacing.window = seconds

    def inline(self, queue: str) -> bool:
        """True: this insert notifies in its own transaction. False: call `after_commit(queue)` once it
        has committed."""
        return self.in_transaction

    def quiet(self, queue: str) -> bool:
        """True: this insert carries its own NOTIFY (NotifyPacing.quiet); call before the insert."""
        return not self.in_transaction and self.pacing.quiet(queue)

    def send_now(self, queue: str) -> bool:
        """True: no NOTIFY of `queue` went in its current window and none is waiting, so the caller sends
        one now with `send_on`, on the connection its insert has just committed on (no other connection to
        wake, no hop through the event loop). False: call `after_commit(queue)`."""
        return not self.in_transaction and self.pacing.send_now(queue, queue in self._trailing)

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
            delay = self.pacing.due(queue) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            trailing.sending = True
            self.pacing.sent(queue, time.monotonic())  # the next one waits a window from this one's start
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


LISTEN_CHANNELS = frozenset({"taskq_jobs", "taskq_cancel", "taskq_queues", "taskq_settle"})
"""The channels the `listen` statement subscribes to."""


class ListenerUnfit(Exception):
    """The LISTEN connection cannot deliver every notification: its server is a standby, or the session
    stopped listening. The listener reconnects."""


async def open_listener(dsn: str, *, connect_timeout: float = 10.0, worker_id: str | None = None
                        ) -> AsyncConnection[Any]:
    """A dedicated autocommit connection, with TCP keepalives and a user timeout (TCP_KEEPALIVES), that
    LISTENs on every taskq channel, on a primary (ListenerUnfit on a standby: LISTEN there would hear
    nothing), named after `worker_id` (LISTENER_APPLICATION_NAME). The worker's listener reads `notifies()`
    from it, probes it (`probe_listener`) and closes it."""
    options: dict[str, Any] = keepalive_kwargs(dsn)
    if worker_id is not None:
        options["application_name"] = LISTENER_APPLICATION_NAME + worker_id
    if "connect_timeout" not in conninfo_to_dict(dsn):  # libpq's, per host tried
        options["connect_timeout"] = max(2, round(connect_timeout))
    conn = await AsyncConnection.connect(dsn, autocommit=True, **options)
    try:
        await probe_listener(conn, listening=False)
        await conn.execute(sql.query("listen"))
    except BaseException:
        await conn.close()
        raise
    return conn


async def probe_listener(conn: AsyncConnection[Any], *, listening: bool = True) -> None:
    """Raise ListenerUnfit when `conn`'s server is in recovery or (`listening`) the session does not listen
    on every taskq channel; a psycopg error when the connection is broken."""
    cur = await conn.execute(sql.query("listener_probe"))
    row = await cur.fetchone()
    assert row is not None
    in_recovery, channels = row
    if in_recovery:
        raise ListenerUnfit("the server is a standby (pg_is_in_recovery): no NOTIFY of the primary's commits "
                            "reaches it")
    if listening and not LISTEN_CHANNELS <= set(channels):
        raise ListenerUnfit(f"the session listens on {sorted(channels)}, not on every taskq channel")
