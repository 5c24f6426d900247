"""The two pieces of the sync face that are written by hand, not generated (tools/async_to_sync.py maps
the async names onto these): a connection pool that opens lazily in the process that uses it, and the
enqueue NOTIFY policy without an event loop.

Why lazily, and per process: a psycopg pool holds sockets and worker threads. A forked child (gunicorn
`--preload`, multiprocessing, a Celery-style prefork) inherits the sockets, which its parent is still
using, and none of the threads. So the real `psycopg_pool.ConnectionPool` is created at the first use in
each process; a child that finds its parent's pool leaves it untouched (psycopg closes a connection only
in the process that opened it, so dropping the parent's objects in the child sends nothing on its
sockets) and opens its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolClosed

CT = TypeVar("CT", bound=Connection[Any])

_lock = threading.Lock()
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
                fresh: ConnectionPool[Any] = ConnectionPool(self._conninfo, open=False, **self._kwargs)
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


class InlineNotifier:
    """The sync client's enqueue NOTIFY: every insert of a due job notifies in its own statement. (The
    async client coalesces NOTIFYs per queue with a trailing one sent from its event loop, which a sync
    client has no loop for; backend_notify.py says what coalescing buys under many producers.)"""

    def __init__(self, pool: object) -> None:
        self.pool = pool

    def inline(self, queue: str) -> bool:
        return True

    def after_commit(self, queue: str) -> None:  # every insert notified inline: nothing follows
        return None

    def flush(self, timeout: float = 5.0) -> None:
        return None
