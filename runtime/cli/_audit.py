"""The audit row of a CLI operator write (`taskq cancel`, `requeue`, `queue pause|resume|limit`,
`schedule pause|resume|trigger`): one per command, written after the change through the database's
`taskq.audit_session_v18`, which sets the principal to `db:<the database role>` itself. The audit is the
CLI's, not JobsClient's: application code calling JobsClient writes no audit row."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import psycopg

from taskq.backend.web import audit_session
from taskq.client import JobsClient
from taskq.exceptions import CliError


async def record(client: JobsClient, action: str, outcome: str, *, job_id: UUID | None = None,
                 queue: str | None = None, schedule: str | None = None, reason: str | None = None,
                 detail: dict[str, Any] | None = None) -> None:
    try:
        await audit_session(client.backend, action, outcome, job_id=job_id, queue=queue, schedule=schedule,
                            reason=reason, detail=detail)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise CliError(f"{action}: done ({outcome}), but its audit row was refused ({exc.diag.message_primary}): "
                       "grant EXECUTE on it by running sql/roles.sql again after the upgrade") from None


def bulk_detail(by_previous_status: dict[Any, int], job_ids: tuple[UUID, ...]) -> dict[str, Any]:
    """A bulk write's detail: how many jobs by previous status, and the first 100 ids."""
    return {"bulk": True, "matched": len(job_ids),
            "by_previous_status": {getattr(k, "value", str(k)): v for k, v in by_previous_status.items()},
            "job_ids": [str(i) for i in job_ids[:100]]}


def pause_outcome(paused: bool, changed: bool) -> str:
    return ("paused" if paused else "resumed") if changed else "unchanged"
