"""The backend's retention statements (part of the SQL layer, split from backend.py by noun): a connection
of the pruner's own, and one bounded batch, the pause after it, and the dry-run count."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
from psycopg import AsyncConnection

from taskq import sql
from taskq.backend._conn import connect_error, connection_kwargs
from taskq.backend.core import Backend
from taskq.models import PruneClass, PruneResult


@contextlib.asynccontextmanager
async def dedicated_connection(backend: Backend, *, timeout: float = 10.0) -> AsyncIterator[AsyncConnection[Any]]:
    """An autocommit connection of its own, outside the pool (pruning must never hold a connection
    the claims and finishes need); closed on exit."""
    try:
        conn = await psycopg.AsyncConnection.connect(
            backend.dsn, connect_timeout=int(max(1, timeout)),
            **connection_kwargs(backend.dsn, worker_id=None, transaction_pooler=backend.transaction_pooler),
        )
    except psycopg.OperationalError as exc:
        raise connect_error(backend.dsn, exc) from None
    try:
        yield conn
    finally:
        await conn.close()


async def job_prune_batch(conn: AsyncConnection[Any], cls: PruneClass, keep: float, limit: int) -> tuple[int, int]:
    """Delete one bounded batch of `cls` rows finished (or, for receipts and audit rows, written) more
    than `keep` seconds ago (jobs with their events); returns (rows deleted, events deleted)."""
    cur = await conn.execute(sql.query(f"prune_{cls.value}"), {"keep": keep, "limit": limit})
    row = await cur.fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


async def job_prune_pause(conn: AsyncConnection[Any], seconds: float) -> None:
    """Wait `seconds` on the server holding the prune gate (if no other pruner holds it)."""
    await conn.execute(sql.query("prune_pause"), {"seconds": seconds})


async def job_prune_count(conn: AsyncConnection[Any], keep: dict[PruneClass, float]) -> PruneResult:
    """What a prune with these windows would delete now (0 disables a class); deletes nothing."""
    cur = await conn.execute(sql.query("prune_count"), {
        "keep_succeeded": keep[PruneClass.SUCCEEDED], "keep_failed": keep[PruneClass.FAILED],
        "keep_attempts": keep[PruneClass.ATTEMPTS], "keep_receipts": keep.get(PruneClass.RECEIPTS, 0.0),
        "keep_audit": keep.get(PruneClass.AUDIT, 0.0),
    })
    row = await cur.fetchone()
    assert row is not None
    return PruneResult(succeeded=int(row[0]), failed=int(row[1]), attempts=int(row[2]), receipts=int(row[3]),
                       audit=int(row[4]), events=int(row[5]), dry_run=True)
