"""The supervisor's database access: short-lived synchronous connections, bounded in time.

The supervisor is single-threaded and has no event loop, so it cannot hold a pool; each call connects,
runs one named query from `taskq.sql` and disconnects. Every wait is bounded (connect_timeout,
lock_timeout, statement_timeout) because the main loop also watches the workers.
"""

from __future__ import annotations

import psycopg

from taskq import sql
from taskq.backend._conn import connect_error

CONNECT_TIMEOUT = 3
"""Seconds (libpq takes whole seconds, at least 2)."""
RECLAIM_LIMIT = 1_000_000
"""No real bound: one worker holds at most twice `concurrency` rows (those running, those whose outcome
is being written)."""
STATEMENT_TIMEOUT_MS = 5000
RETRY_BASE_DELAY = 1.0
RETRY_MAX_DELAY = 60.0
"""Backoff of a reclaimed row that has attempts left: the same as the lock-expiry sweeper's."""


def _connect(dsn: str, *, autocommit: bool) -> psycopg.Connection[tuple[object, ...]]:
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=CONNECT_TIMEOUT)
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
                {"worker_id": worker_id, "cause": cause, "detail": detail, "sweeper_id": reclaimer_id, "tracked": None,
                 "limit": RECLAIM_LIMIT, "base_delay": RETRY_BASE_DELAY, "max_delay": RETRY_MAX_DELAY},
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
