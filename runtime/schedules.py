"""`Schedule`: a periodic job declared in code, checked when it is declared.

A schedule names its slots (nominal run times) by a cron expression in a time zone, or by a fixed
interval anchored at the Unix epoch; the slot arithmetic itself is `taskq.slots` (pure), re-exported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from taskq.actors.declaration import Actor
from taskq.enqueue import prepare_insert
from taskq.exceptions import PayloadInvalid, ScheduleDefinitionError
from taskq.slots import MAX_SLOTS_PER_TICK, MISFIRES, OVERLAPS, Misfire, Overlap, SlotSpec, TickPlan, plan_tick

__all__ = [
    "DEFAULT_MAX_CATCH_UP",
    "DEFAULT_MISFIRE_GRACE",
    "MAX_NAME_LENGTH",
    "MAX_SLOTS_PER_TICK",
    "MISFIRES",
    "OVERLAPS",
    "Misfire",
    "Overlap",
    "Schedule",
    "SlotSpec",
    "TickPlan",
    "plan_tick",
]


MAX_NAME_LENGTH = 200
"""Shorter than the 255 characters of other names: the slot's unique key is `schedule:<name>:<time>`."""
DEFAULT_MISFIRE_GRACE = 60.0
"""Seconds after its nominal time within which a slot still runs as on time (a scheduler tick may come
late: a busy host, a rolling restart of the whole fleet). An older slot is a misfire."""
DEFAULT_MAX_CATCH_UP = 10


@dataclass(frozen=True, eq=False)
class Schedule:
    """A periodic job: `cron=` (5 fields, or 6 with seconds first) in `timezone`, or `every=` a fixed
    interval (whole seconds, at least one; slots are multiples of it since the Unix epoch, in UTC).

    Each slot makes exactly one job (`ctx.scheduled_for` is the slot's nominal time), whatever the number
    of workers. `misfire` decides about slots no scheduler reached within `misfire_grace` seconds (the
    fleet was down, the schedule was paused): "skip" (default) drops them, "run_once" makes one job for
    all of them (for the latest), "catch_up" makes one per missed slot, the latest `max_catch_up`.
    `overlap="skip"` makes no slot job while the schedule's previous job is still pending or running.

    Invalid values raise ScheduleDefinitionError at construction, before anything is stored."""

    name: str
    actor: Actor[Any, Any]
    cron: str | None = None
    every: timedelta | float | None = None
    timezone: str = "UTC"
    payload: Any = None
    misfire: Misfire = "skip"
    max_catch_up: int = DEFAULT_MAX_CATCH_UP
    misfire_grace: timedelta | float = DEFAULT_MISFIRE_GRACE
    overlap: Overlap = "allow"
    queue: str | None = None
    priority: int | None = None
    tags: tuple[str, ...] = ()
    max_attempts: int | None = None
    payload_json: str = field(init=False, repr=False)
    every_seconds: int | None = field(init=False, repr=False)
    grace_seconds: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or len(self.name) > MAX_NAME_LENGTH or (
            "\x00" in self.name or self.name != self.name.strip()
        ):
            raise ScheduleDefinitionError(
                f"schedule name must be 1-{MAX_NAME_LENGTH} characters without NUL or surrounding spaces, "
                f"got {self.name!r}"
            )
        where = f"schedule {self.name!r}"
        if not isinstance(self.actor, Actor):
            raise ScheduleDefinitionError(f"{where}: actor must be an @actor, got {self.actor!r}")
        if (self.cron is None) == (self.every is None):
            raise ScheduleDefinitionError(f"{where}: give exactly one of cron= or every=")
        zone = _zone(where, self.timezone)
        every: int | None = None
        if self.cron is not None:
            _check_cron(where, self.cron, zone)
        else:
            every = _every_seconds(where, self.every)
        if self.misfire not in MISFIRES:
            raise ScheduleDefinitionError(f"{where}: misfire must be one of {MISFIRES}, got {self.misfire!r}")
        if self.overlap not in OVERLAPS:
            raise ScheduleDefinitionError(f"{where}: overlap must be one of {OVERLAPS}, got {self.overlap!r}")
        if isinstance(self.max_catch_up, bool) or not isinstance(self.max_catch_up, int) or not (
            1 <= self.max_catch_up <= MAX_SLOTS_PER_TICK
        ):
            raise ScheduleDefinitionError(
                f"{where}: max_catch_up must be an int from 1 to {MAX_SLOTS_PER_TICK}, got {self.max_catch_up!r}"
            )
        grace = _seconds(self.misfire_grace)
        if grace is None or grace < 0:
            raise ScheduleDefinitionError(
                f"{where}: misfire_grace must be a finite duration >= 0, got {self.misfire_grace!r}"
            )
        # the options every enqueue checks, so that a slot job can never be refused at insert time
        try:
            job = prepare_insert(
                self.actor, self.payload, registry=_NO_REGISTRY, max_payload_bytes=1024 * 1024,
                queue=self.queue, priority=self.priority, tags=tuple(self.tags), max_attempts=self.max_attempts,
            )
        except PayloadInvalid as exc:
            raise ScheduleDefinitionError(f"{where}: {exc}") from None
        except Exception as exc:  # ConfigurationError: a bad queue, tag, priority or max_attempts
            raise ScheduleDefinitionError(f"{where}: {exc}") from None
        object.__setattr__(self, "tags", job.options.tags)
        object.__setattr__(self, "queue", job.options.queue)
        object.__setattr__(self, "priority", job.options.priority)
        object.__setattr__(self, "max_attempts", job.options.max_attempts)
        object.__setattr__(self, "payload_json", job.payload_json)
        object.__setattr__(self, "every_seconds", every)
        object.__setattr__(self, "grace_seconds", grace)

    @property
    def spec(self) -> SlotSpec:
        return SlotSpec(cron=self.cron, every_seconds=self.every_seconds, timezone=self.timezone)

    @property
    def definition(self) -> str:
        """What the slot sequence depends on: a change of it moves the next slot."""
        return self.spec.definition

    def declaration(self) -> dict[str, Any]:
        """The row this declaration upserts (without next_run_at, which needs the database's clock)."""
        return {
            "name": self.name, "actor": self.actor.name, "queue": self.queue, "payload": self.payload_json,
            "priority": self.priority, "tags": list(self.tags), "max_attempts": self.max_attempts,
            "cron": self.cron, "every_seconds": self.every_seconds, "timezone": self.timezone,
            "misfire": self.misfire, "max_catch_up": self.max_catch_up, "misfire_grace": self.grace_seconds,
            "overlap": self.overlap, "definition": self.definition,
        }


class _NoRegistry:
    def get(self, name: str) -> None:
        return None


_NO_REGISTRY: Any = _NoRegistry()


def _zone(where: str, name: Any) -> ZoneInfo:
    if not isinstance(name, str) or not name or "\x00" in name:
        raise ScheduleDefinitionError(f"{where}: timezone must be an IANA zone name such as 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ScheduleDefinitionError(
            f"{where}: unknown time zone {name!r} (an IANA name such as 'Europe/Berlin' or 'UTC')"
        ) from None


def _check_cron(where: str, expr: Any, zone: ZoneInfo) -> None:
    if not isinstance(expr, str) or not expr.strip() or "\x00" in expr or len(expr) > 255:
        raise ScheduleDefinitionError(f"{where}: cron must be a cron expression such as '0 3 * * *'")
    if len(expr.split()) not in (5, 6):
        raise ScheduleDefinitionError(
            f"{where}: invalid cron expression {expr!r}: expected 5 fields (minute hour day month weekday), "
            "or 6 with seconds first"
        )
    try:
        next(iter(CronSim(expr, datetime(2000, 1, 1, tzinfo=zone))))
    except CronSimError as exc:
        raise ScheduleDefinitionError(f"{where}: invalid cron expression {expr!r}: {exc}") from None
    except StopIteration:
        raise ScheduleDefinitionError(f"{where}: cron expression {expr!r} never matches a date") from None


def _seconds(value: Any) -> float | None:
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _every_seconds(where: str, value: Any) -> int:
    seconds = _seconds(value)
    if seconds is None or seconds <= 0:
        raise ScheduleDefinitionError(f"{where}: every must be a positive duration, got {value!r}")
    if seconds < 1 or seconds != int(seconds):
        raise ScheduleDefinitionError(f"{where}: every must be a whole number of seconds >= 1, got {value!r}")
    return int(seconds)
