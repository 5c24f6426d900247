"""The backend of `taskq doctor`: reads what PostgreSQL and taskq's worker registry say about the health of the
queue's database (sql/doctor.sql), and probes the path to the server for a pooler. Nothing here judges:
taskq.ops.doctor turns these facts into checks with a status. Nothing is written.

Each read runs on its own in autocommit, on a connection opened here (not a Backend pool: doctor must run
against a database without taskq's schema, and through a transaction pooler); a read the role may not make
comes back as `Unreadable` with PostgreSQL's reason, and the other reads go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection, errors
from psycopg.rows import dict_row

from taskq import sql
from taskq.backend._conn import connect_error
from taskq.exceptions import SchemaNotReady

STARTUP_OPTIONS_PROBE = "-c taskq.worker_id=taskq-doctor"
"""The startup `options` a worker sends (without transaction_pooler), sent by the pooler probe: a pooler that
refuses it refuses every worker (`FATAL: unsupported startup parameter: options`)."""


@dataclass(frozen=True)
class Unreadable:
    """A read that failed (a missing privilege, a view this server lacks): PostgreSQL's first line."""

    reason: str


Row = dict[str, Any]


@dataclass
class PoolerProbe:
    """What the path to the server showed.

    `key_pid` is the process id the server announced at connect time (BackendKeyData) and `pids` the
    pg_backend_pid() of successive one-statement transactions: on connection A, then on a second
    connection B, then on A again. Direct, every transaction of A runs in A's backend, the announced one, and
    B's is another. A pooler announces an id of its own; in transaction mode A's transactions may move and B
    may run in the backend A just left."""

    key_pid: int
    pids: tuple[int, int, int]
    options_refused: str | None
    """The error of a connection that sent a worker's startup `options`, or None if it was accepted."""

    @property
    def proxied(self) -> bool:
        return self.key_pid != self.pids[0]

    @property
    def shares_backends(self) -> bool:
        a1, b, a2 = self.pids
        return a1 != a2 or b in (a1, a2)


@dataclass
class Facts:
    """Everything `taskq doctor` read, each item a row (or rows), or Unreadable."""

    server: Row
    schema_version: int | Unreadable
    latest_version: int
    clock_skew: float
    """Seconds the database's clock is ahead of this host's (negative: behind)."""
    clock_uncertainty: float
    """Half the round trip of the best of the clock reads: the skew is known to this much."""
    oldest_transaction: Row | Unreadable
    xmin_horizon: Row | Unreadable | None
    slots: list[Row] | Unreadable
    tables: list[Row] | Unreadable
    xid_age: Row | Unreadable
    workers: Row | Unreadable
    pooler: PoolerProbe | Unreadable


async def _connect(dsn: str, timeout: float, **kwargs: Any) -> AsyncConnection[Any]:
    return await AsyncConnection.connect(dsn, autocommit=True, prepare_threshold=None,
                                         connect_timeout=int(max(1, timeout)), **kwargs)


async def _rows(conn: AsyncConnection[Any], name: str) -> list[Row] | Unreadable:
    try:
        async with conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(sql.query(name), {})
            return list(await cur.fetchall())
    except (errors.InsufficientPrivilege, errors.UndefinedTable, errors.UndefinedFunction,
            errors.UndefinedObject, errors.ObjectNotInPrerequisiteState) as exc:
        return Unreadable(_first_line(exc))


async def _row(conn: AsyncConnection[Any], name: str) -> Row | Unreadable:
    rows = await _rows(conn, name)
    if isinstance(rows, Unreadable):
        return rows
    return rows[0]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def schema_version(conn: AsyncConnection[Any]) -> int | Unreadable:
    """The schema's version; SchemaNotReady when the database has no taskq schema at all."""
    try:
        cur = await conn.execute(sql.query("schema_version"))
        row = await cur.fetchone()
    except errors.UndefinedTable:
        raise SchemaNotReady("the database has no taskq schema: run `taskq migrate`") from None
    except errors.InsufficientPrivilege as exc:
        return Unreadable(_first_line(exc))
    return int(row[0]) if row else 0


async def clock_skew(conn: AsyncConnection[Any], *, reads: int = 5) -> tuple[float, float]:
    """(seconds the server's clock is ahead of this host's, uncertainty): the read with the shortest round
    trip of `reads`, compared with the midpoint of this host's clock around it."""
    best: tuple[float, float] | None = None
    for _ in range(reads):
        before = time.time()
        cur = await conn.execute(sql.query("doctor_clock"))
        row = await cur.fetchone()
        after = time.time()
        assert row is not None
        skew, half = row[0].timestamp() - (before + after) / 2, (after - before) / 2
        if best is None or half < best[1]:
            best = (skew, half)
    assert best is not None
    return best


async def _pid(conn: AsyncConnection[Any]) -> int:
    cur = await conn.execute(sql.query("doctor_pids"))
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def pooler_probe(dsn: str, conn: AsyncConnection[Any], *, timeout: float) -> PoolerProbe | Unreadable:
    """Probe the path to the server (see PoolerProbe) with `conn` and two more connections."""
    refused: str | None = None
    try:
        with_options = await _connect(dsn, timeout, options=STARTUP_OPTIONS_PROBE)
        await with_options.close()
    except psycopg.OperationalError as exc:
        text = " ".join(str(exc).split())
        refused = text.split("FATAL: ", 1)[-1] if "FATAL: " in text else _first_line(exc)
    try:
        other = await _connect(dsn, timeout)
    except psycopg.OperationalError as exc:  # e.g. no free slot: the probe is then inconclusive
        return Unreadable(f"a second connection failed: {_first_line(exc)}")
    try:
        first = await _pid(conn)
        second = await _pid(other)
        third = await _pid(conn)
    finally:
        await other.close()
    return PoolerProbe(key_pid=conn.info.backend_pid, pids=(first, second, third), options_refused=refused)


async def collect(dsn: str, *, timeout: float = 10.0) -> Facts:
    """Read every fact doctor judges. DatabaseUnavailable if the server cannot be reached, SchemaNotReady if
    the database has no taskq schema."""
    try:
        conn = await _connect(dsn, timeout)
    except psycopg.OperationalError as exc:
        raise connect_error(dsn, exc) from None
    async with conn:
        version = await schema_version(conn)
        server = await _row(conn, "doctor_server")
        if isinstance(server, Unreadable):  # every role may read these: only a server this old lacks one
            raise SchemaNotReady(f"taskq doctor cannot read the server's settings: {server.reason}")
        skew, uncertainty = await clock_skew(conn)
        horizon = await _rows(conn, "doctor_xmin_horizon")
        return Facts(
            server=server,
            schema_version=version,
            latest_version=sql.latest_version(),
            clock_skew=skew,
            clock_uncertainty=uncertainty,
            oldest_transaction=await _row(conn, "doctor_oldest_transaction"),
            xmin_horizon=horizon if isinstance(horizon, Unreadable) else (horizon[0] if horizon else None),
            slots=await _rows(conn, "doctor_slots"),
            tables=await _rows(conn, "doctor_tables"),
            xid_age=await _row(conn, "doctor_xid_age"),
            workers=await _row(conn, "doctor_workers"),
            pooler=await pooler_probe(dsn, conn, timeout=timeout),
        )
