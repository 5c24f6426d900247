"""The slot arithmetic of schedules, pure: a schedule's slots (nominal run times) by a cron expression in
a time zone or by a fixed interval anchored at the Unix epoch, and which slots one scheduler tick fires.
"Now" is always passed in (the scheduler passes the database's clock, so that workers whose clocks drift
agree on which slots are due). Declarations are `taskq.schedules.Schedule`; the scheduler service is
`taskq.worker.scheduler`; the backend stores slots by this arithmetic without knowing declarations."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal
from zoneinfo import ZoneInfo

from cronsim import CronSim

Misfire = Literal["skip", "run_once", "catch_up"]
Overlap = Literal["allow", "skip"]
MISFIRES: tuple[Misfire, ...] = ("skip", "run_once", "catch_up")
OVERLAPS: tuple[Overlap, ...] = ("allow", "skip")

MAX_SLOTS_PER_TICK = 1000
"""However long the fleet was down, one tick never computes more slots than this for one schedule."""
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)



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
