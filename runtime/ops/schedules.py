"""Operator actions on schedules: list, pause, resume, trigger. One function per action, called alike
by JobsClient, the CLI and (later) the web API; each checks its input before any database work."""

from __future__ import annotations

import getpass
import os

from taskq.backend import Backend
from taskq.exceptions import ConfigurationError, ScheduleNotFound
from taskq.models import ScheduleInfo, SchedulePauseResult, ScheduleTriggerResult
from taskq.schedules import MAX_NAME_LENGTH


def check_schedule_name(name: object) -> str:
    """A schedule name as stored, or ConfigurationError (never a database round trip for a bad one)."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME_LENGTH or "\x00" in name:
        raise ConfigurationError(f"a schedule name is 1-{MAX_NAME_LENGTH} characters without NUL, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigurationError(f"a schedule name must be valid Unicode, got {name!r}") from None
    return name


def operator_name() -> str:
    """Who an operator action is recorded as when the caller names nobody: user@host."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{os.uname().nodename}"


async def list_schedules(backend: Backend) -> list[ScheduleInfo]:
    """Every schedule, by name: enabled or not (a schedule gone from the code stays, disabled)."""
    return await backend.schedule_list()


async def get_schedule(backend: Backend, name: str) -> ScheduleInfo:
    rows = await backend.schedule_list(check_schedule_name(name))
    if not rows:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return rows[0]


async def pause_schedule(backend: Backend, name: str, *, by: str | None = None) -> SchedulePauseResult:
    """Stop making slot jobs for the schedule until it is resumed (a running job is not touched)."""
    return await _set_paused(backend, name, True, by)


async def resume_schedule(backend: Backend, name: str) -> SchedulePauseResult:
    """Make slot jobs again; the slots passed while paused are misfires (the schedule's misfire policy)."""
    return await _set_paused(backend, name, False, None)


async def _set_paused(backend: Backend, name: str, paused: bool, by: str | None) -> SchedulePauseResult:
    name = check_schedule_name(name)
    if by is not None and (not isinstance(by, str) or len(by) > 255 or "\x00" in by):
        raise ConfigurationError(f"by must be at most 255 characters without NUL, got {by!r}")
    changed = await backend.schedule_set_paused(name, paused, by if by is not None else operator_name())
    if changed is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return SchedulePauseResult(name=name, paused=paused, changed=changed)


async def trigger_schedule(backend: Backend, name: str) -> ScheduleTriggerResult:
    """Enqueue one job of the schedule now, outside its slot sequence, whether or not it is paused."""
    name = check_schedule_name(name)
    made = await backend.schedule_trigger(name)
    if made is None:
        raise ScheduleNotFound(f"no schedule named {name!r}")
    return ScheduleTriggerResult(name=name, job_id=made[0], scheduled_for=made[1])
