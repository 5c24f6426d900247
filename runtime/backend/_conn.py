"""Connection helpers of the backend that need no pool: ids, connect arguments, how an outage is told
from a failed statement. Shared by the async and the sync backend and by the supervisor's store."""

from __future__ import annotations

import os
import time
from typing import Any
from uuid import UUID

import psycopg
from psycopg.conninfo import conninfo_to_dict

from taskq.dsn import redact_dsn
from taskq.exceptions import DatabaseUnavailable

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
    """A DatabaseUnavailable naming the server (never the password) and PostgreSQL's first line."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(f"cannot connect to PostgreSQL at {redact_dsn(dsn)}: {detail}")


def is_connection_lost(exc: BaseException) -> bool:
    """The error says the server is out of reach, not that the statement failed: the connection broke
    or no pooled connection came (no SQLSTATE), a connection exception (class 08), the server shutting
    down or starting up (57P01-57P05), or no connection slot left (53300)."""
    if not isinstance(exc, psycopg.OperationalError):
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in _SERVER_GONE_STATES


_SERVER_GONE_STATES = frozenset({"57P01", "57P02", "57P03", "57P04", "57P05", "53300"})


WORKER_APPLICATION_NAME = "taskq-worker "
"""A worker's connections carry `application_name` = this prefix + its id: the lease-loss triggers read it
to tell the worker's own writes from anyone else's. Transaction poolers (PgBouncer) carry application_name
to whichever server connection runs the transaction, where they refuse a startup `options` setting."""


def connection_kwargs(dsn: str, *, worker_id: str | None, transaction_pooler: bool) -> dict[str, Any]:
    """psycopg connect arguments beyond the DSN: the worker's identity, and no prepared statements
    through a transaction pooler (the next transaction may run on a server connection that lacks them)."""
    kwargs: dict[str, Any] = {"autocommit": True}
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


def _escape_option(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def transaction_pooler_from_env() -> bool:
    """`TASKQ_TRANSACTION_POOLER` as the settings read it (1/true/yes/on), for clients without settings."""
    return os.environ.get("TASKQ_TRANSACTION_POOLER", "").strip().lower() in ("1", "true", "yes", "on")

