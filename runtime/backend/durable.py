"""Durable jobs in the database: steps, sleeps and waits of an attempt (fenced by attempt and claim
epoch), and the signals sent to a job (sql/durable.sql, sql/0017_durable_jobs.sql)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq import sql

__all__ = ["SentSignal", "SignalRow", "StepRow", "StoredStep", "TakenSignal", "list_signals", "list_steps",
           "load_steps", "reset_steps", "save_step", "send_signal", "signal_timeout", "take_signal", "tx_fence"]


@dataclass(frozen=True, slots=True)
class StoredStep:
    """What an earlier attempt stored for one step, sleep or wait, read at the start of a rerun."""

    kind: str
    name: str
    result: Any
    wake_at: datetime | None
    due: bool
    """wake_at has passed by the database's clock (when it was read)."""


@dataclass(frozen=True, slots=True)
class StepRow:
    """A step, sleep or wait of a job as `taskq job`, the API and the dashboard show it."""

    kind: str
    name: str
    attempt: int
    claim_epoch: int
    result: Any
    wake_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class SignalRow:
    """A signal sent to a job; consumed_* set once a wait of the job took it."""

    id: int
    name: str
    payload: Any
    sent_at: datetime
    sent_by: str | None
    consumed_at: datetime | None
    consumed_attempt: int | None
    consumed_by: str | None


@dataclass(frozen=True, slots=True)
class TakenSignal:
    held: bool
    """The attempt still held the job (False: nothing was read or written)."""
    signal_id: int | None
    payload: Any


@dataclass(frozen=True, slots=True)
class SentSignal:
    status: str | None
    """The job's status when the signal arrived (None: no such job)."""
    signal_id: int | None
    """The signal's id (None: not kept, the job had ended or does not exist)."""
    woke: bool
    """The job was waiting for this signal's name and is due now."""


def _fence(job_id: UUID, attempt: int, claim_epoch: int, worker_id: str) -> dict[str, Any]:
    """The fence of a durable write: the attempt that holds the job, and its holder (sql/jobs.sql's header)."""
    return {"job_id": job_id, "attempt": attempt, "claim_epoch": claim_epoch, "worker_id": worker_id}


async def load_steps(conn: AsyncConnection[Any], job_id: UUID) -> list[StoredStep]:
    cur = await conn.execute(sql.query("steps_load"), {"job_id": job_id})
    return [StoredStep(kind, name, result, wake_at, due) for kind, name, result, wake_at, due, _, _ in
            await cur.fetchall()]


async def save_step(conn: AsyncConnection[Any], job_id: UUID, attempt: int, claim_epoch: int, *, kind: str,
                    name: str, worker_id: str, result_json: str | None = None, delay: float | None = None,
                    wake_at: datetime | None = None) -> tuple[bool, datetime | None, bool]:
    """Store a step's result (`result_json`) or a sleep's or a wait's wake-up (`delay` seconds from the
    database's now, inf for none, or `wake_at`). Returns (held, wake_at stored, due): held False means the
    attempt no longer holds the job and nothing was written."""
    cur = await conn.execute(sql.query("step_save"), {
        **_fence(job_id, attempt, claim_epoch, worker_id), "kind": kind, "name": name, "result": result_json,
        "delay": delay, "wake_at": wake_at,
    })
    row = await cur.fetchone()
    assert row is not None
    held, stored_wake, due = row
    return bool(held), stored_wake, bool(due)


async def take_signal(conn: AsyncConnection[Any], job_id: UUID, attempt: int, claim_epoch: int, *, name: str,
                      wait: str, worker_id: str) -> TakenSignal:
    cur = await conn.execute(sql.query("signal_take"), {**_fence(job_id, attempt, claim_epoch, worker_id),
                                                         "name": name, "wait": wait})
    row = await cur.fetchone()
    assert row is not None
    held, signal_id, payload = row
    return TakenSignal(bool(held), signal_id, payload)


async def signal_timeout(conn: AsyncConnection[Any], job_id: UUID, attempt: int, claim_epoch: int, *,
                         wait: str, worker_id: str) -> bool:
    """Remember that wait `wait` timed out; False when the attempt no longer holds the job."""
    cur = await conn.execute(sql.query("signal_timeout"), {**_fence(job_id, attempt, claim_epoch, worker_id),
                                                           "wait": wait})
    row = await cur.fetchone()
    return bool(row and row[0])


async def send_signal(conn: AsyncConnection[Any], job_id: UUID, name: str, payload_json: str | None,
                      sent_by: str | None) -> SentSignal:
    cur = await conn.execute(sql.query("signal_send"), {
        "job_id": job_id, "name": name, "payload": payload_json, "sent_by": sent_by,
    })
    row = await cur.fetchone()
    if row is None:
        return SentSignal(None, None, False)
    status, signal_id, woke, _ = row
    return SentSignal(status, signal_id, bool(woke))


async def list_steps(conn: AsyncConnection[Any], job_id: UUID) -> list[StepRow]:
    cur = await conn.execute(sql.query("job_steps_list"), {"job_id": job_id})
    return [StepRow(*r) for r in await cur.fetchall()]


async def list_signals(conn: AsyncConnection[Any], job_id: UUID) -> list[SignalRow]:
    cur = await conn.execute(sql.query("job_signals_list"), {"job_id": job_id})
    return [SignalRow(*r) for r in await cur.fetchall()]


async def tx_fence(conn: AsyncConnection[Any], job_id: UUID, attempt: int, claim_epoch: int, worker_id: str) -> bool:
    """Inside a `ctx.transaction()`: lock the job's row if this attempt still holds it (False: it does not)."""
    cur = await conn.execute(sql.query("job_tx_fence"), {"id": job_id, "attempt": attempt,
                                                         "claim_epoch": claim_epoch, "worker_id": worker_id})
    return await cur.fetchone() is not None


async def reset_steps(conn: AsyncConnection[Any], job_ids: list[UUID]) -> int:
    """Forget the stored steps, sleeps and waits of these jobs (requeue with reset_steps=True)."""
    cur = await conn.execute(sql.query("job_steps_reset"), {"ids": job_ids})
    return cur.rowcount

