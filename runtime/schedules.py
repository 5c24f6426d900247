"""`Schedule`: a periodic job declared in code, and the pure slot arithmetic the scheduler runs on.

A schedule names its slots (nominal run times) by a cron expression in a time zone, or by a fixed
interval anchored at the Unix epoch. Everything here is pure: "now" is always passed in (the scheduler
passes the database's clock, so that workers whose clocks drift agree on which slots are due).
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from taskq.actors.declaration import Actor
from taskq.enqueue import prepare_insert
from taskq.exceptions import PayloadInvalid, ScheduleDefinitionError

Misfire = Literal["skip", "run_once", "catch_up"]
Overlap = Literal["allow", "skip"]
MISFIRES: tuple[Misfire, ...] = ("skip", "run_once", "catch_up")
OVERLAPS: tuple[Overlap, ...] = ("allow", "skip")

MAX_NAME_LENGTH = 200
"""Shorter than the 255 characters of other names: the slot's unique key is `schedule:<name>:<time>`."""
DEFAULT_MISFIRE_GRACE = 60.0
"""Seconds after its nominal time within which a slot still runs as on time (a scheduler tick may come
late: a busy host, a rolling restart of the whole fleet). An older slot is a misfire."""
DEFAULT_MAX_CATCH_UP = 10
MAX_SLOTS_PER_TICK = 1000
"""However long the fleet was down, one tick never computes more slots than this for one schedule."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)


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


# -- slot arithmetic (pure) --------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotSpec:
    """The slot sequence of a schedule, as stored in its row."""

    cron: str | None
    every_seconds: int | None
    timezone: str

    @property
    def definition(self) -> str:
        return json.dumps([self.cron, self.every_seconds, self.timezone])

    def next_after(self, t: datetime) -> datetime:
        """The first slot strictly after `t` (aware), in UTC.

        Cron slots are wall-clock times in the zone. A local time that does not exist (spring forward)
        runs once, at the first valid instant after the gap; an ambiguous one (fall back) runs once, at
        its first occurrence. Expressions that name every minute or hour (`*/15 * * * *`) keep to real
        time instead: a fixed rhythm is not doubled nor dropped by a change of the clocks."""
        t = t.astimezone(UTC)
        if self.every_seconds is not None:
            step = timedelta(seconds=self.every_seconds)
            return _EPOCH + ((t - _EPOCH) // step + 1) * step
        return next(self._cron_after(t))

    def _cron_after(self, t: datetime) -> Iterator[datetime]:
        """Cron slots strictly after `t`, strictly increasing, in UTC."""
        assert self.cron is not None
        last = t
        for candidate in CronSim(self.cron, t.astimezone(ZoneInfo(self.timezone))):
            slot = candidate.astimezone(UTC)
            # a start inside a repeated hour can yield a wall time whose first occurrence is already past
            if slot > last:
                last = slot
                yield slot

    def slots_between(self, first: datetime, until: datetime) -> list[datetime]:
        """Slots s with first <= s <= until, oldest first (for tests and tools; the scheduler uses plan_tick)."""
        out: list[datetime] = []
        if first > until:
            return out
        slot = self.next_after(first - _US)
        while slot <= until:
            out.append(slot)
            slot = self.next_after(slot)
        return out


@dataclass(frozen=True)
class TickPlan:
    """What one tick does for one due schedule."""

    slots: list[datetime]
    """The slot jobs to insert, oldest first."""
    missed: int
    """Slots that misfired (reached later than the grace), whether or not a job stands for them."""
    next_run_at: datetime


def plan_tick(
    spec: SlotSpec,
    next_run_at: datetime,
    now: datetime,
    *,
    misfire: Misfire,
    max_catch_up: int,
    misfire_grace: float,
    overlap: Overlap,
    resumed_at: datetime | None = None,
) -> TickPlan:
    """The slots a tick at `now` makes for a schedule whose next slot is `next_run_at`.

    Due slots are those in [next_run_at, now]. One reached within `misfire_grace` seconds of its time is
    on time and always runs, unless it is older than `resumed_at` (it passed while the schedule was
    paused or disabled). The others misfired: `skip` drops them, `run_once` makes one job (for the
    latest of them), `catch_up` one per slot, the latest `max_catch_up`. With `overlap="skip"` at most
    one job is made (the latest slot), since each would overlap the one before. The next slot is the
    first after `now`: computed from the nominal times, never from when the tick ran."""
    now = now.astimezone(UTC)
    cutoff = now - timedelta(seconds=misfire_grace)
    if resumed_at is not None and resumed_at > cutoff:
        cutoff = resumed_at.astimezone(UTC)
    keep = {"skip": 0, "run_once": 1, "catch_up": max_catch_up}[misfire]
    on_time: list[datetime]
    late: list[datetime]
    if spec.every_seconds is not None:
        step = timedelta(seconds=spec.every_seconds)
        lo = -((_EPOCH - next_run_at.astimezone(UTC)) // step)  # the first slot index >= next_run_at
        hi = (now - _EPOCH) // step  # the last slot index <= now
        first_on_time = max(lo, -((_EPOCH - cutoff) // step))
        on_time = [_EPOCH + k * step for k in range(max(first_on_time, hi - MAX_SLOTS_PER_TICK + 1), hi + 1)]
        last_late = min(hi, first_on_time - 1)
        missed = max(0, last_late - lo + 1)
        late = [_EPOCH + k * step for k in range(max(lo, last_late - keep + 1), last_late + 1)] if keep else []
    else:
        kept: deque[datetime] = deque(maxlen=keep)
        recent: deque[datetime] = deque(maxlen=MAX_SLOTS_PER_TICK)
        missed = 0
        for slot in spec._cron_after(next_run_at.astimezone(UTC) - _US):
            if slot > now:
                break
            if slot >= cutoff:
                recent.append(slot)
            else:
                missed += 1
                kept.append(slot)
        on_time, late = list(recent), list(kept)
    slots = late + on_time
    if overlap == "skip":
        slots = slots[-1:]
    return TickPlan(slots=slots, missed=missed, next_run_at=spec.next_after(now))
