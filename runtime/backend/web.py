"""The backend's statements for the web API and dashboard (part of the SQL layer, split from backend.py by
noun): tokens, idempotency receipts, the audit log, the API's job pages and the overview's stats, and a
transaction that the operator actions (taskq.ops.jobs, taskq.ops.schedules) can run inside.

The list statements go unprepared (`prepare=False`): each then gets a plan for its own filters, where a
prepared generic plan would have to serve every combination of the optional ones.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast
from uuid import UUID

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from taskq import sql
from taskq.backend.core import Backend
from taskq.backend.params import row_to_job
from taskq.exceptions import TokenRevoked
from taskq.models import JobRow

__all__ = ["AuditEntry", "JobPage", "Tx", "audit", "audit_session", "fetch_all", "fetch_one", "page_params",
           "transaction"]


class _OneConnection:
    """Stands in for the pool of a Backend bound to one connection in an open transaction: every method
    of that Backend then runs in the transaction (the pool's own `connection()` would take another)."""

    def __init__(self, conn: AsyncConnection[Any]) -> None:
        self.conn = conn

    @contextlib.asynccontextmanager
    async def connection(self, timeout: float | None = None) -> AsyncIterator[AsyncConnection[Any]]:
        yield self.conn

    async def getconn(self, timeout: float | None = None) -> AsyncConnection[Any]:
        return self.conn

    async def putconn(self, conn: AsyncConnection[Any]) -> None:
        return None


@dataclass(frozen=True, slots=True)
class Tx:
    """One open transaction: its connection, and a Backend whose every method runs in it."""

    conn: AsyncConnection[Any]
    backend: Backend


@contextlib.asynccontextmanager
async def transaction(backend: Backend) -> AsyncIterator[Tx]:
    """Commit when the block ends, roll back when it raises."""
    async with backend.pool.connection() as conn, conn.transaction():
        pool = cast(AsyncConnectionPool[AsyncConnection[Any]], _OneConnection(conn))
        yield Tx(conn, Backend(pool, backend.dsn, transaction_pooler=backend.transaction_pooler))


async def fetch_one(
    where: Backend | AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """One row of the named statement as a dict (None if it returns none), on a pooled connection or in
    the caller's transaction."""
    rows = await fetch_all(where, name, params)
    return rows[0] if rows else None


async def fetch_all(
    where: Backend | AsyncConnection[Any], name: str, params: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    async with contextlib.AsyncExitStack() as stack:
        conn = where if isinstance(where, AsyncConnection) else await stack.enter_async_context(
            where.pool.connection()
        )
        cur = await stack.enter_async_context(conn.cursor(row_factory=dict_row))
        await cur.execute(sql.query(name), params or {}, prepare=False)
        return await cur.fetchall() if cur.description is not None else []


async def jobs(where: Backend | AsyncConnection[Any], name: str, params: dict[str, Any]) -> list[JobRow]:
    return [row_to_job(r) for r in await fetch_all(where, name, params)]


@dataclass(frozen=True, slots=True)
class JobPage:
    rows: list[JobRow]
    next_after: tuple[datetime, UUID] | None


def page_params(params: dict[str, Any]) -> dict[str, Any]:
    """job_page's parameters with `readable` and `allowed` (LIKE patterns, backslash escapes) each split into
    the exact names among them (`*_names`, unescaped) and the patterns with a wildcard (`*_like`). A list
    of names only becomes part of the `queues` filter (intersected with it), which the planner reads as
    an equality on queue: a scoped token's page plans as a page filtered by its queues."""
    out = dict(params)
    for key in ("readable", "allowed"):
        names: list[str] = []
        likes: list[str] = []
        for pattern in params.get(key) or ():
            plain, wild, escaped = [], False, False
            for ch in pattern:
                if escaped:
                    plain.append(ch)
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch in "%_":
                    wild = True
                    break
                else:
                    plain.append(ch)
            (likes.append(pattern) if wild else names.append("".join(plain)))
        out[f"{key}_names"], out[f"{key}_like"] = names, likes
        if params.get(key) is not None and not likes:
            given = params.get("queues")
            out["queues"] = sorted(set(names) if given is None else set(names) & set(given))
            out[key], out[f"{key}_names"] = None, []
    return out


async def job_page(backend: Backend, params: dict[str, Any], limit: int) -> JobPage:
    """One keyset page (newest first) and the cursor of the next one (None on the last page)."""
    rows = await jobs(backend, "job_page", page_params(params) | {"limit": limit + 1})
    more = len(rows) > limit
    rows = rows[:limit]
    return JobPage(rows, (rows[-1].created_at, rows[-1].id) if more and rows else None)


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One operator write, for the audit log and the timelines of the jobs it touched."""

    principal: str
    action: str
    request_id: str | None
    idempotency_key: str | None = None
    reason: str | None = None
    expected_revision: int | None = None
    schedule: str | None = None
    detail: dict[str, Any] | None = None


async def audit(
    conn: AsyncConnection[Any], entry: AuditEntry, touched: list[tuple[UUID | None, str | None, int | None, str]]
) -> None:
    """Write the audit rows (one per (job id, queue, revision, outcome) touched) in the caller's transaction,
    through the database's audit function (`taskq.audit_write_v18`, the web role's): it refuses an unknown
    action or outcome, a principal that is not a live token's name nor `anonymous`, and a job not in the
    queue given (the action's transaction then rolls back); a refused write (`conflict`,
    `unique_key_held`) repeated by the same principal on the same job within 60 s only counts on its row."""
    try:
        await _audit_insert(conn, entry, touched)
    except psycopg.errors.InsufficientPrivilege as exc:
        if "neither a live token" not in str(exc):
            raise
        raise TokenRevoked(f"token {entry.principal!r} is no longer live (revoked): nothing was written") from None


async def _audit_insert(
    conn: AsyncConnection[Any], entry: AuditEntry, touched: list[tuple[UUID | None, str | None, int | None, str]]
) -> None:
    await conn.execute(
        sql.query("audit_insert"),
        {
            "principal": entry.principal, "action": entry.action, "schedule": entry.schedule,
            "reason": entry.reason, "request_id": entry.request_id, "idempotency_key": entry.idempotency_key,
            "expected_revision": entry.expected_revision, "detail": Jsonb(entry.detail or {}),
            "job_ids": [t[0] for t in touched], "queues": [t[1] for t in touched],
            "revisions": [t[2] for t in touched], "outcomes": [t[3] for t in touched],
        },
    )


async def audit_session(
    backend: Backend, action: str, outcome: str, *, job_id: UUID | None = None, queue: str | None = None,
    schedule: str | None = None, reason: str | None = None, detail: dict[str, Any] | None = None,
) -> None:
    """One audit row for an operator write made from the CLI (`taskq.audit_session_v18`, the client role's):
    the database sets the principal to `db:<session_user>`; a job given without its queue gets its own."""
    await fetch_all(backend, "audit_session", {
        "action": action, "outcome": outcome, "job_id": job_id, "queue": queue, "schedule": schedule,
        "reason": reason, "detail": Jsonb(detail or {}),
    })
