"""Durable jobs, the operator's side: send a signal to a job, read its steps and signals. The checks of
names and payloads are here too, shared by the client, the CLI, the web API and the worker's context."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from taskq.backend import Backend
from taskq.backend import durable as durable_store
from taskq.backend.durable import SignalRow, StepRow
from taskq.checks import as_job_id
from taskq.exceptions import JobNotFound, SignalInvalid, SignalRefused

__all__ = ["MAX_NAME", "MAX_SIGNAL_PAYLOAD", "SignalResult", "check_name", "check_signal_payload",
           "job_signals", "job_steps", "send_signal", "send_signal_json"]

MAX_NAME = 200
"""The longest step or signal name, in characters."""
MAX_SIGNAL_PAYLOAD = 1024 * 1024
"""The largest signal payload, in bytes of JSON."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


@dataclass(frozen=True, slots=True)
class SignalResult:
    """A signal sent: its id, the job's status when it arrived, and whether the job was waiting for it
    (then it is due now)."""

    job_id: UUID
    signal_id: int
    status: str
    woke: bool


def check_name(name: Any, what: str, error: type[Exception] = SignalInvalid) -> str:
    """A step's or a signal's name: a non-empty string of at most MAX_NAME characters, no control character."""
    if not isinstance(name, str):
        raise error(f"{what} name must be a string, got {type(name).__name__}")
    if not name:
        raise error(f"{what} name must not be empty")
    if len(name) > MAX_NAME:
        raise error(f"{what} name is {len(name)} characters long; the limit is {MAX_NAME}")
    if _CONTROL.search(name):
        raise error(f"{what} name {name!r} contains a control character")
    return name


def check_signal_payload(payload: Any) -> str | None:
    """The payload as JSON text (None for None): SignalInvalid unless it is JSON of at most 1 MiB."""
    if payload is None:
        return None
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise SignalInvalid(f"signal payload is not JSON: {exc}") from None
    if "\\u0000" in text:
        raise SignalInvalid("signal payload contains a NUL character, which PostgreSQL cannot store")
    size = len(text.encode("utf-8"))
    if size > MAX_SIGNAL_PAYLOAD:
        raise SignalInvalid(f"signal payload is {size:,} bytes of JSON; the limit is {MAX_SIGNAL_PAYLOAD:,} (1 MiB)")
    return text


async def send_signal(backend: Backend, job_id: UUID | str, name: str, payload: Any = None, *,
                      sent_by: str | None = None) -> SignalResult:
    """Send signal `name` with `payload` to the job: kept until a `ctx.wait_for_signal(name)` of the job takes
    it (in the order sent); a job waiting for that name is due at once. JobNotFound for an unknown id,
    SignalRefused for a job that has ended, SignalInvalid for a bad name or payload: nothing stored then."""
    name = check_name(name, "signal")
    return await send_signal_json(backend, job_id, name, check_signal_payload(payload), sent_by=sent_by)


async def send_signal_json(backend: Backend, job_id: UUID | str, name: str, text: str | None, *,
                           sent_by: str | None = None) -> SignalResult:
    """`send_signal` of a payload already checked and encoded by `check_signal_payload` (the web API checks
    the name and the payload first, each answered as its own field)."""
    jid = as_job_id(job_id)
    name = check_name(name, "signal")
    async with backend.pool.connection() as conn:
        sent = await durable_store.send_signal(conn, jid, name, text, sent_by)
    if sent.status is None:
        raise JobNotFound(f"no job {jid}")
    if sent.signal_id is None:
        raise SignalRefused(f"job {jid} has ended ({sent.status}): a signal can no longer reach it", sent.status)
    return SignalResult(jid, sent.signal_id, sent.status, sent.woke)


async def job_steps(backend: Backend, job_id: UUID | str) -> list[StepRow]:
    """The job's stored steps, sleeps and waits, oldest first."""
    async with backend.pool.connection() as conn:
        return await durable_store.list_steps(conn, as_job_id(job_id))


async def job_signals(backend: Backend, job_id: UUID | str) -> list[SignalRow]:
    """The signals sent to the job, in order."""
    async with backend.pool.connection() as conn:
        return await durable_store.list_signals(conn, as_job_id(job_id))
