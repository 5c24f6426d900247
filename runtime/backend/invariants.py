"""The invariant queries of `taskq.invariants`: each returns the offending jobs as (job_id, detail)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq import sql


async def violations(
    conn: AsyncConnection[Any], names: Iterable[str], *, stale_after: float
) -> list[tuple[str, UUID, str]]:
    """(invariant, job id, detail) for every row that breaks one of the named invariants."""
    found: list[tuple[str, UUID, str]] = []
    for name in names:
        cur = await conn.execute(sql.query(name), {"stale_after": stale_after})
        found += [(name, job_id, detail) for job_id, detail in await cur.fetchall()]
    return found


async def jobs_by_status(conn: AsyncConnection[Any]) -> dict[str, int]:
    cur = await conn.execute(sql.query("inv_summary_status"))
    return {str(s): int(n) for s, n in await cur.fetchall()}


async def executions(conn: AsyncConnection[Any]) -> dict[int, int]:
    """How many jobs ran how many times."""
    cur = await conn.execute(sql.query("inv_summary_executions"))
    return {int(a): int(n) for a, n in await cur.fetchall()}
