"""Connection helpers of the backend that need no pool: ids, connect arguments, how an outage is told
from a failed statement. Shared by the async and the sync backend and by the supervisor's store."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any
from uuid import UUID

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed

from taskq.dsn import redact_dsn
from taskq.exceptions import DatabaseUnavailable

log = logging.getLogger("taskq.client")

JOBS_CHANNEL = "taskq_jobs"

CANCEL_CHANNEL = "taskq_cancel"


_UUID7_VERSION = 0x7 << 76
_UUID7_VARIANT = 0b10 << 62
_RAND_B_MASK = (1 << 62) - 1


def uuid7() -> UUID:
    """A time-ordered UUID (RFC 9562 version 7), so new rows land at the right edge of the primary key."""
    r = int.from_bytes(os.urandom(10), "big")
    head = ((time.time_ns() // 1_000_000) << 80) | _UUID7_VERSION | _UUID7_VARIANT
    return UUID(int=head | ((r >> 62 & 0xFFF) << 64) | (r & _RAND_B_MASK))


def uuid7_many(n: int) -> list[UUID]:
    """`n` version-7 UUIDs of the current millisecond, drawing the random bits in one call."""
    head = ((time.time_ns() // 1_000_000) << 80) | _UUID7_VERSION | _UUID7_VARIANT
    rand = os.urandom(10 * n)
    ids = []
    for i in range(0, 10 * n, 10):
        r = int.from_bytes(rand[i : i + 10], "big")
        ids.append(UUID(int=head | ((r >> 62 & 0xFFF) << 64) | (r & _RAND_B_MASK)))
    return ids


def connect_error(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """A DatabaseUnavailable naming the server (never the password) and PostgreSQL's first line (with
    several hosts, each host's), with what to do when the cause is a known misconfiguration."""
    text = str(exc).strip()
    lines = text.splitlines()
    detail = lines[0] if lines else type(exc).__name__
    per_host = [line.strip()[2:] for line in lines if line.strip().startswith("- host:")]
    if per_host:  # libpq tried every host of a multi-host DSN
        detail = "every host failed: " + "; ".join(per_host)
    return DatabaseUnavailable(f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {detail}{_hint(text)}")


def _hint(text: str) -> str:
    if "unsupported startup parameter" in text:
        return (" (this looks like a transaction pooler, such as PgBouncer, which refuses the worker's startup "
                "options: set transaction_pooler (TASKQ_TRANSACTION_POOLER=1) and give listen_dsn a direct DSN)")
    if "read-only" in text or "hot standby" in text:
        return (" (no host of the DSN takes writes: taskq needs the primary; with several hosts, "
                "target_session_attrs=read-write picks it, and a failover in progress ends once one is promoted)")
    return ""


def outage_error(dsn: str, exc: BaseException) -> DatabaseUnavailable:
    """The DatabaseUnavailable for an error `is_connection_lost` accepts: what happened, and where."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return DatabaseUnavailable(
            f"PostgreSQL at {redact_dsn(dsn)} is read-only (a standby, or a primary being demoted): {detail}; "
            "nothing was written. With several hosts in the DSN, add target_session_attrs=read-write")
    return DatabaseUnavailable(f"lost the connection to PostgreSQL at {redact_dsn(dsn)}: {detail}")


def is_connection_lost(exc: BaseException) -> bool:
    """The error says the server is out of reach, not that the statement failed: the connection broke
    or no pooled connection came (no SQLSTATE), a connection exception (class 08), the server shutting
    down or starting up (57P01-57P05), or no connection slot left (53300); or the server cannot take
    writes (25006 read_only_sql_transaction: a standby, or a primary being demoted), which wrote nothing
    and is as good as gone for a queue (the pool discards the connection: `discard_read_only`)."""
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return True
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE_STATES


_SERVER_GONE_STATES = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05", "53300"})


WORKER_APPLICATION_NAME = "taskq-worker "
"""A worker's connections carry `application_name` = this prefix + its id: the lease-loss triggers read it
to tell the worker's own writes from anyone else's. Transaction poolers (PgBouncer) carry application_name
to whichever server connection runs the transaction, where they refuse a startup `options` setting."""


LISTENER_APPLICATION_NAME = "taskq-listener "
"""A worker's LISTEN connection carries `application_name` = this prefix + the worker's id: `taskq doctor` and
the failover drill count the workers listening on a server by it."""


def connection_kwargs(dsn: str, *, worker_id: str | None, transaction_pooler: bool) -> dict[str, Any]:
    """psycopg connect arguments beyond the DSN: the worker's identity, and no prepared statements
    through a transaction pooler (the next transaction may run on a server connection that lacks them)."""
    kwargs: dict[str, Any] = {"autocommit": True, **keepalive_kwargs(dsn)}
    if transaction_pooler:
        kwargs["prepare_threshold"] = None
    if worker_id is not None:
        kwargs["application_name"] = WORKER_APPLICATION_NAME + worker_id
        if not transaction_pooler:
            # exact even for an id longer than application_name's 63 bytes; PgBouncer refuses it
            given = conninfo_to_dict(dsn).get("options")
            extra = f"-c taskq.worker_id={_escape_option(worker_id)}"
            kwargs["options"] = f"{given} {extra}" if given else extra
    return kwargs


def read_only_reason(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> str | None:
    """Why the server at the other end of `conn` cannot take writes, as it last reported (no round trip:
    PostgreSQL 14 and later report both settings whenever they change), or None: in_hot_standby (a standby,
    or a primary that was demoted) or default_transaction_read_only (a primary told to refuse writes)."""
    if conn.closed:
        return None
    # libpq's own answers, as bytes: ConnectionInfo.parameter_status decodes each (2.2 us per pooled use
    # against 0.2)
    status = conn.pgconn.parameter_status
    if status(b"in_hot_standby") == b"on":
        return "it is a standby (in_hot_standby = on)"
    if status(b"default_transaction_read_only") == b"on":
        return "it refuses writes (default_transaction_read_only = on)"
    return None


RECONNECT_SERIES = 2.0
"""Seconds of one series of a pool's reconnection attempts (see SteadyRetry)."""


class SteadyRetry:
    """A pool's reconnection, kept at a steady pace while the server is away. psycopg_pool doubles the delay
    between attempts within one series of `reconnect_timeout` seconds (1, 2, 4, 8, 16 s...), so a pool that
    lost its server for the 20 s of a failover may try next 10 s after the new primary took writes, and every
    request waits that long. Here a series lasts RECONNECT_SERIES seconds (attempts after 0, 1 and 2 s) and a
    failed series starts the next one at once (`pool.check()`, public: it grows an empty pool by one), for
    `retry_for` seconds from the outage's first failed series: the pool connects within about a second of
    the server's return. Past `retry_for` it waits for a request to try again, as psycopg_pool does."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self._since: float | None = None
        self._succeeded = -1

    def should_retry(self, stats: dict[str, int]) -> bool:
        """Called when a series failed; `stats` is the pool's get_stats()."""
        succeeded = stats.get("connections_num", 0) - stats.get("connections_errors", 0)
        now = time.monotonic()
        if self._since is None or succeeded != self._succeeded:  # a connection came since: a new outage
            self._since, self._succeeded = now - RECONNECT_SERIES, succeeded
        return stats.get("pool_available", 0) == 0 and now - self._since < self.retry_for


async def _next_series_async(pool: AsyncConnectionPool[Any]) -> None:
    if isinstance(pool, ReadWritePool) and pool.steady.should_retry(pool.get_stats()) and not pool.closed:
        with contextlib.suppress(PoolClosed):
            await pool.check()


def _next_series_sync(pool: ConnectionPool[Any]) -> None:
    if isinstance(pool, ReadWritePoolSync) and pool.steady.should_retry(pool.get_stats()) and not pool.closed:
        with contextlib.suppress(PoolClosed):
            pool.check()


def _closed_instead(conn: AbandoningConnection | AbandoningConnectionSync) -> bool:
    """An AbandoningConnection's choice when psycopg would cancel its statement: True when its database is in
    doubt and the connection was closed instead (nothing to cancel then)."""
    if conn.abandon is None or not conn.abandon():
        return False
    log.warning("closing a connection with a statement in flight instead of cancelling it (the database is in "
                "doubt; see AbandoningConnection)")
    conn.pgconn.finish()
    return True


class AbandoningConnection(AsyncConnection[Any]):
    """A worker's connection. When a task awaiting a statement is cancelled, psycopg asks the server to cancel
    the statement (`cancel_safe`). A COMMIT that waits for a synchronous standby is already written on this
    server: a cancel makes it visible here without replication (PostgreSQL's "canceling wait for synchronous
    replication"), and on a primary cut off from its standbys (a failover under way) that is a finished job
    a reader sees which the new primary never had, and pg_rewind later reverts. So once `abandon()` says the
    database is in doubt (the worker lost its leases, a release failed, heartbeats fail) the connection is
    closed instead: its server session may still finish the statement, but nothing waiting for a standby is
    made visible by taskq. A healthy database still gets the cancel (a claim cancelled at a stop is rolled
    back rather than left to commit for a worker on its way out)."""

    abandon: Callable[[], bool] | None = None

    async def cancel_safe(self, *, timeout: float = 30.0) -> None:
        if not _closed_instead(self):
            await super().cancel_safe(timeout=timeout)


class ReadWritePool(AsyncConnectionPool[AsyncConnection[Any]]):
    """A pool that never serves a connection whose server cannot take writes: one returned read-only is
    closed (the pool opens another, which `target_session_attrs=read-write` sends to the primary). Each
    write on it would otherwise fail with SQLSTATE 25006 for as long as the connection lived. The check
    reads what the server last reported, so it costs no round trip. It reconnects at a steady pace
    (SteadyRetry) for `reconnect_timeout` seconds of an outage. With `abandon` (a worker's pool), its
    connections are AbandoningConnection."""

    def __init__(self, conninfo: str = "", *, reconnect_timeout: float = 300.0,
                 abandon: Callable[[], bool] | None = None, **kwargs: Any) -> None:
        self.steady = SteadyRetry(reconnect_timeout)
        self.abandon = abandon
        if abandon is not None:
            kwargs |= {"connection_class": AbandoningConnection, "configure": self._attach}
        super().__init__(conninfo, reconnect_timeout=min(RECONNECT_SERIES, reconnect_timeout),
                         reconnect_failed=_next_series_async, **kwargs)

    async def _attach(self, conn: AsyncConnection[Any]) -> None:
        if isinstance(conn, AbandoningConnection):
            conn.abandon = self.abandon

    async def putconn(self, conn: AsyncConnection[Any]) -> None:
        reason = read_only_reason(conn)
        if reason is not None:
            log.warning("discarding a pooled connection: %s", reason)
            await conn.close()
        await super().putconn(conn)


class AbandoningConnectionSync(Connection[Any]):
    """AbandoningConnection for the sync backend (psycopg cancels a statement interrupted by Ctrl-C)."""

    abandon: Callable[[], bool] | None = None

    def cancel_safe(self, *, timeout: float = 30.0) -> None:
        if not _closed_instead(self):
            super().cancel_safe(timeout=timeout)


class ReadWritePoolSync(ConnectionPool[Connection[Any]]):
    """ReadWritePool for the sync client."""

    def __init__(self, conninfo: str = "", *, reconnect_timeout: float = 300.0,
                 abandon: Callable[[], bool] | None = None, **kwargs: Any) -> None:
        self.steady = SteadyRetry(reconnect_timeout)
        self.abandon = abandon
        if abandon is not None:
            kwargs |= {"connection_class": AbandoningConnectionSync, "configure": self._attach}
        super().__init__(conninfo, reconnect_timeout=min(RECONNECT_SERIES, reconnect_timeout),
                         reconnect_failed=_next_series_sync, **kwargs)

    def _attach(self, conn: Connection[Any]) -> None:
        if isinstance(conn, AbandoningConnectionSync):
            conn.abandon = self.abandon

    def putconn(self, conn: Connection[Any]) -> None:
        reason = read_only_reason(conn)
        if reason is not None:
            log.warning("discarding a pooled connection: %s", reason)
            conn.close()
        super().putconn(conn)


TCP_KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 3,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}
"""libpq's TCP settings on every taskq connection unless the DSN sets them: an idle connection whose peer
vanished (a partition, a host that died without a reset) is declared dead after about 19 s (10 s idle, then
3 probes 3 s apart) instead of the kernel's two hours, and one whose sent data goes unacknowledged for 15 s
fails then. Ignored on Unix sockets."""


def keepalive_kwargs(dsn: str) -> dict[str, Any]:
    """TCP_KEEPALIVES, less whatever `dsn` sets itself."""
    given = conninfo_to_dict(dsn)
    return {k: v for k, v in TCP_KEEPALIVES.items() if k not in given}


def _escape_option(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def transaction_pooler_from_env() -> bool:
    """`TASKQ_TRANSACTION_POOLER` as the settings read it (1/true/yes/on), for clients without settings."""
    return os.environ.get("TASKQ_TRANSACTION_POOLER", "").strip().lower() in ("1", "true", "yes", "on")

