"""The two pieces of the sync face that are written by hand, not generated (tools/async_to_sync.py maps
the async names onto these): a connection pool that opens lazily in the process that uses it, and the
enqueue NOTIFY sent after commit without an event loop.

Why lazily, and per process: a psycopg pool holds sockets and worker threads. A forked child (gunicorn
`--preload`, multiprocessing, a Celery-style prefork) inherits the sockets, which its parent is still
using, and none of the threads. So the real `psycopg_pool.ConnectionPool` is created at the first use in
each process; a child that finds its parent's pool leaves it untouched (psycopg closes a connection only
in the process that opened it, so dropping the parent's objects in the child sends nothing on its
sockets) and opens its own.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolClosed

from taskq import sql
from taskq.backend._conn import ReadWritePoolSync
from taskq.backend.notify import NOTIFY_WINDOW, NotifyPacing

CT = TypeVar("CT", bound=Connection[Any])

_lock = threading.Lock()
log = logging.getLogger("taskq.client")
_inherited: list[ConnectionPool[Any]] = []
"""Pools a forked child found from its parent: kept referenced, because a pool's finaliser would wait
for worker threads that do not exist in the child."""


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread of the parent may have held it at the fork


os.register_at_fork(after_in_child=_after_fork_in_child)


class LazyConnectionPool(Generic[CT]):
    """A `psycopg_pool.ConnectionPool` opened on first use in each process (see the module docstring).
    It takes the ConnectionPool's arguments; `open()` only records that the pool may open. Thread-safe."""

    def __init__(self, conninfo: str = "", *, open: bool = False, **kwargs: Any) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self._pool: ConnectionPool[Any] | None = None
        self._pid = 0
        self._open_timeout = float(kwargs.get("timeout", 30.0))
        self._closed = False

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        """Nothing opens here: the pool opens, and waits up to `timeout` for its first connections, at the
        first use in each process."""
        self._open_timeout = timeout

    def _current(self) -> ConnectionPool[Any]:
        pool = self._pool
        if pool is not None and self._pid == os.getpid():
            return pool
        with _lock:
            if self._closed:
                raise PoolClosed("the taskq client is closed")
            pid = os.getpid()
            if self._pool is not None and self._pid != pid:
                _inherited.append(self._pool)
                self._pool = None
            if self._pool is None:
                fresh: ConnectionPool[Any] = ReadWritePoolSync(self._conninfo, open=False, **self._kwargs)
                fresh.open(wait=True, timeout=self._open_timeout)
                self._pool, self._pid = fresh, pid
            return self._pool

    def getconn(self, timeout: float | None = None) -> CT:
        conn: CT = self._current().getconn(timeout)
        return conn

    def putconn(self, conn: CT) -> None:
        self._current().putconn(conn)

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[CT]:
        with self._current().connection(timeout) as conn:
            yield conn

    def close(self, timeout: float = 5.0) -> None:
        """Close this process's pool (a parent's pool inherited by a fork is left to its parent)."""
        with _lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None and self._pid == os.getpid():
            pool.close(timeout=timeout)

    @property
    def opened_in_this_process(self) -> bool:
        return self._pool is not None and self._pid == os.getpid()


class SyncNotifier:
    """The sync client's enqueue NOTIFY: sent after the insert commits, coalesced per queue within
    `window`. The rules are backend_notify.EnqueueNotifier's (which says why): a NOTIFY at once, on the
    insert's own connection, when none of the queue went in the last window; else one at the window's
    end, from one daemon thread per client process, that covers every job committed before it goes.
    After os.fork() the child starts with nothing pending (what the parent committed is the parent's to
    notify) and its own thread."""

    def __init__(self, pool: Any, window: float = NOTIFY_WINDOW) -> None:
        self.pool = pool
        self.pacing = NotifyPacing(window)
        self.in_transaction = False
        """True: every insert notifies in its own transaction (as taskq did before; for comparisons)."""
        self._reset()

    @property
    def window(self) -> float:
        """The quiet gap and a busy queue's first window (NotifyPacing.window)."""
        return self.pacing.window

    @window.setter
    def window(self, seconds: float) -> None:
        self.pacing.window = seconds

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._cond = threading.Condition()
        self.pacing = NotifyPacing(self.pacing.window, self.pacing.max_window)  # its settings, none of its state
        self._due: dict[str, float] = {}  # queue -> monotonic time its NOTIFY may go
        self._thread: threading.Thread | None = None
        self._closed = False

    def inline(self, queue: str) -> bool:
        return self.in_transaction

    def quiet(self, queue: str) -> bool:
        """EnqueueNotifier.quiet: True when this insert carries its own NOTIFY (NotifyPacing.quiet)."""
        if self.in_transaction:
            return False
        self._check_pid()
        with self._cond:
            return not self._closed and self.pacing.quiet(queue)

    def send_now(self, queue: str) -> bool:
        """EnqueueNotifier.send_now: True when the caller sends the NOTIFY itself, now, with `send_on`."""
        if self.in_transaction:
            return False
        self._check_pid()
        with self._cond:
            return not self._closed and self.pacing.send_now(queue, queue in self._due)

    def send_on(self, conn: Any, queue: str) -> None:
        try:
            conn.execute(sql.query("jobs_notify"), {"queue": queue})
        except Exception as exc:  # the insert has committed; the workers' polling finds the job
            log.warning("could not send the NOTIFY for queue %r (workers find its jobs by polling): %s", queue, exc)

    def _check_pid(self) -> None:
        if self._pid != os.getpid():
            with _lock:
                if self._pid != os.getpid():
                    self._reset()

    def after_commit(self, queue: str) -> None:
        self._check_pid()
        with self._cond:
            closed = self._closed
            if not closed and queue not in self._due:  # one already pending covers this job
                self._due[queue] = self.pacing.due(queue)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="taskq-notify", daemon=True)
                    self._thread.start()
                self._cond.notify()
        if closed:  # an enqueue racing close(): the thread is gone, so notify here
            self._notify_now(queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._closed:
                        return
                    if not self._due:
                        self._cond.wait()
                        continue
                    queue, at = min(self._due.items(), key=lambda item: item[1])
                    now = time.monotonic()
                    if at <= now:
                        del self._due[queue]
                        self.pacing.sent(queue, now)
                        break
                    self._cond.wait(at - now)
            self._notify_now(queue)

    def _notify_now(self, queue: str) -> None:
        try:
            with self.pool.connection() as conn:
                conn.execute(sql.query("jobs_notify"), {"queue": queue})
        except Exception as exc:  # the workers' polling finds the jobs all the same
            log.warning("could not send the NOTIFY for queue %r (workers find its jobs by polling): %s", queue, exc)

    def flush(self, timeout: float = 5.0) -> None:
        """Stop the thread and send the NOTIFYs still waiting, now: the pool is about to close."""
        if self._pid != os.getpid():
            return
        with self._cond:
            self._closed = True
            due, self._due = list(self._due), {}
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout)  # one on its way finishes first
        for queue in due:
            self._notify_now(queue)
