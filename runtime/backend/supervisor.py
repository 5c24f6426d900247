"""The supervisor's database access: short-lived synchronous connections, bounded in time.

The supervisor is single-threaded and has no event loop, so it cannot hold a pool; each call connects,
runs one named query from `taskq.sql` and disconnects. Every wait is bounded (connect_timeout,
lock_timeout, statement_timeout) because the main loop also watches the workers.
"""

from __future__ import annotations

import psycopg

from taskq import sql
from taskq.backend._conn import connect_error, keepalive_kwargs
from taskq.backend.workers import reclaim_params

CONNECT_TIMEOUT = 3
"""Seconds (libpq takes whole seconds, at least 2)."""
RECLAIM_LIMIT = 1_000_000
"""No real bound: one worker holds at most twice `concurrency` rows (those running, those whose outcome
is being written)."""
STATEMENT_TIMEOUT_MS = 5000


def _connect(dsn: str, *, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT, **keepalive_kwargs(dsn))
    except psycopg.Error as exc:
        raise connect_error(dsn, exc) from None


def reclaim_dead_worker(
    dsn: str, worker_id: str, *, cause: str, detail: str, reclaimer_id: str
) -> dict[str, int]:
    """Reclaim every running row of a worker known to be dead. Returns verdict -> count.
    Raises DatabaseUnavailable or psycopg.Error; the caller retries or leaves it to lock expiry."""
    with _connect(dsn, autocommit=False) as conn:
        with conn.transaction():
            conn.execute(sql.query("supervisor_tx_timeouts"), {"ms": STATEMENT_TIMEOUT_MS})
            # the sweeper's query and verdicts, for this worker's rows only and without waiting for expiry
            cur = conn.execute(
                sql.query("job_reclaim"),
                reclaim_params(worker_id=worker_id, cause=cause, detail=detail, reclaimer_id=reclaimer_id,
                               tracked=None, limit=RECLAIM_LIMIT),
            )
            counts: dict[str, int] = {}
            for _job_id, status in cur.fetchall():
                counts[str(status)] = counts.get(str(status), 0) + 1
            conn.execute(sql.query("worker_deregister"), {"id": worker_id})
        return counts


def ping(dsn: str) -> None:
    """SELECT 1; raises DatabaseUnavailable (message without the password) when it cannot."""
    try:
        with _connect(dsn, autocommit=True) as conn:
            conn.execute(sql.query("supervisor_ping")).fetchone()
    except psycopg.Error as exc:
        raise connect_error(dsn, exc) from None


class Pinger:
    """Readiness checks on one connection kept between them (a reconnect only after a failure), each
    bounded in time: connect_timeout, then statement and lock timeouts in its transaction. Not
    thread-safe: the caller serialises the calls."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def ping(self) -> None:
        """SELECT 1; raises DatabaseUnavailable (message without the password) when it cannot."""
        try:
            if self.conn is None or self.conn.closed:
                self.conn = _connect(self.dsn, autocommit=True)
            with self.conn.transaction():
                self.conn.execute(sql.query("supervisor_tx_timeouts"), {"ms": STATEMENT_TIMEOUT_MS})
                self.conn.execute(sql.query("supervisor_ping")).fetchone()
        except psycopg.Error as exc:
            self.close()
            raise connect_error(self.dsn, exc) from None
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
            self.conn = None
