"""Schedule declarations and the pure slot arithmetic, with an injected "now" (no database, no clock)."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import BaseModel

from taskq import JobContext, Schedule
from taskq.actors.declaration import ActorRegistry, actor, as_registry
from taskq.exceptions import ScheduleDefinitionError
from taskq.schedules import Misfire, Overlap, SlotSpec, TickPlan, plan_tick

BERLIN = ZoneInfo("Europe/Berlin")
reg = ActorRegistry()


class ReportSpec(BaseModel):
    region: str


@actor(name="reports.build", queues=["default", "reports"], registry=reg)
async def build_report(payload: ReportSpec, ctx: JobContext[ReportSpec]) -> None:
    return None


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def berlin(year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, fold: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=BERLIN, fold=fold)


def nightly(expr: str = "30 2 * * *") -> SlotSpec:
    return SlotSpec(cron=expr, every_seconds=None, timezone="Europe/Berlin")


# -- declaration -------------------------------------------------------------------------------------


def test_schedule_declares_cron_in_a_zone_with_a_validated_payload() -> None:
    s = Schedule(name="nightly-report", actor=build_report, cron="0 3 * * *", timezone="Europe/Berlin",
                 payload=ReportSpec(region="eu"), queue="reports", priority=5, tags=("cron",))
    assert s.payload_json == '{"region":"eu"}'
    assert (s.queue, s.priority, s.tags, s.max_attempts) == ("reports", 5, ("cron",), 3)
    assert s.misfire == "skip" and s.overlap == "allow" and s.max_catch_up == 10


def test_schedule_takes_every_as_timedelta_or_seconds() -> None:
    five_minutes = Schedule(name="a", actor=build_report, every=timedelta(minutes=5), payload={"region": "x"})
    assert five_minutes.every_seconds == 300
    assert Schedule(name="b", actor=build_report, every=10, payload={"region": "x"}).every_seconds == 10


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression"),
        ({"cron": "* * *"}, "expected 5 fields"),
        ({"cron": "0 3 30 2 *"}, "cron expression"),
        ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": timedelta(0)}, "every must be a positive duration"),
        ({"every": -5}, "every must be a positive duration"),
        ({"every": 0.5}, "whole number of seconds"),
        ({"every": float("nan")}, "every must be a positive duration"),
        ({"cron": "0 3 * * *", "every": 60}, "exactly one of cron= or every="),
        ({}, "exactly one of cron= or every="),
        ({"every": 60, "payload": {"region": 7}}, "invalid payload"),
        ({"every": 60, "payload": None}, "invalid payload"),
        ({"every": 60, "misfire": "later"}, "misfire must be one of"),
        ({"every": 60, "overlap": "queue"}, "overlap must be one of"),
        ({"every": 60, "max_catch_up": 0}, "max_catch_up"),
        ({"every": 60, "misfire_grace": -1}, "misfire_grace"),
        ({"every": 60, "queue": ""}, "queue"),
        ({"every": 60, "priority": 2**40}, "priority"),
    ],
)
def test_bad_declarations_raise_schedule_definition_error(options: dict[str, Any], message: str) -> None:
    options.setdefault("payload", {"region": "eu"})
    with pytest.raises(ScheduleDefinitionError, match=message):
        Schedule(name="bad", actor=build_report, **options)


@pytest.mark.parametrize("name", ["", " padded", "x" * 201, "nul\x00"])
def test_bad_schedule_names_are_refused(name: str) -> None:
    with pytest.raises(ScheduleDefinitionError, match="schedule name"):
        Schedule(name=name, actor=build_report, every=60, payload={"region": "eu"})


def test_a_schedule_needs_an_actor_object() -> None:
    with pytest.raises(ScheduleDefinitionError, match="actor must be an @actor"):
        Schedule(name="x", actor="reports.build", every=60)  # type: ignore[arg-type]


def test_an_app_list_mixes_actors_and_schedules_and_registers_the_schedules_actor() -> None:
    s = Schedule(name="nightly", actor=build_report, cron="0 3 * * *", payload={"region": "eu"})
    registry = as_registry([s])
    assert registry.schedules() == [s] and "reports.build" in registry
    with pytest.raises(ScheduleDefinitionError, match="two schedules"):
        as_registry([s, Schedule(name="nightly", actor=build_report, every=5, payload={"region": "eu"})])


# -- slots across both Europe/Berlin transitions ----------------------------------------------------


def test_spring_forward_nonexistent_local_time_runs_once_at_the_next_valid_instant() -> None:
    # 2026-03-29: clocks go from 02:00 CET to 03:00 CEST; 02:30 does not exist that day
    slots = nightly().slots_between(utc(2026, 3, 28, 12), utc(2026, 3, 30, 12))
    assert [s.astimezone(BERLIN) for s in slots] == [berlin(2026, 3, 29, 3, 0), berlin(2026, 3, 30, 2, 30)]
    assert slots[0] == utc(2026, 3, 29, 1, 0)


def test_fall_back_ambiguous_local_time_runs_once_at_its_first_occurrence() -> None:
    # 2026-10-25: clocks go from 03:00 CEST back to 02:00 CET; 02:30 happens twice
    slots = nightly().slots_between(utc(2026, 10, 24, 12), utc(2026, 10, 26, 12))
    assert slots == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    assert slots[0].astimezone(BERLIN).utcoffset() == timedelta(hours=2)  # the first 02:30 (CEST, fold=0)


def test_a_start_inside_the_repeated_hour_does_not_go_back_to_its_first_occurrence() -> None:
    # now is 02:15 CET (the second 02:15): the day's 02:30 slot (CEST) is already past
    now = berlin(2026, 10, 25, 2, 15, fold=1).astimezone(UTC)
    assert nightly().next_after(now) == utc(2026, 10, 26, 1, 30)


def test_a_fixed_rhythm_keeps_real_time_across_the_transitions() -> None:
    spec = nightly("*/30 * * * *")
    fall = spec.slots_between(utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2, 15))
    assert [b - a for a, b in itertools.pairwise(fall)] == [timedelta(minutes=30)] * (len(fall) - 1)
    assert len(fall) == 5  # 00:00 .. 02:00 UTC: the repeated hour is run in full, each instant once
    spring = spec.slots_between(utc(2026, 3, 29, 0, 15), utc(2026, 3, 29, 1, 45))
    assert spring == [utc(2026, 3, 29, 0, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 29, 1, 30)]


def test_interval_slots_are_multiples_of_the_interval_since_the_epoch() -> None:
    spec = SlotSpec(cron=None, every_seconds=10, timezone="UTC")
    assert spec.next_after(utc(2026, 1, 1, 0, 0, 3)) == utc(2026, 1, 1, 0, 0, 10)
    assert spec.next_after(utc(2026, 1, 1, 0, 0, 10)) == utc(2026, 1, 1, 0, 0, 20)
    assert spec.slots_between(utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 0, 30)) == [
        utc(2026, 1, 1, 0, 0, 10), utc(2026, 1, 1, 0, 0, 20), utc(2026, 1, 1, 0, 0, 30)
    ]


# -- misfire and overlap policies ---------------------------------------------------------------------

EVERY_SECOND = SlotSpec(cron=None, every_seconds=1, timezone="UTC")
NOW = utc(2026, 6, 1, 12, 0, 10, 500)  # 12:00:10.0005


def plan(misfire: Misfire, *, next_run_at: datetime, max_catch_up: int = 10, grace: float = 0.75,
         overlap: Overlap = "allow", resumed_at: datetime | None = None) -> TickPlan:
    return plan_tick(EVERY_SECOND, next_run_at, NOW, misfire=misfire, max_catch_up=max_catch_up,
                     misfire_grace=grace, overlap=overlap, resumed_at=resumed_at)


def test_an_on_time_tick_makes_the_due_slot_and_moves_to_the_next() -> None:
    p = plan("skip", next_run_at=utc(2026, 6, 1, 12, 0, 10))
    assert p.slots == [utc(2026, 6, 1, 12, 0, 10)] and p.missed == 0
    assert p.next_run_at == utc(2026, 6, 1, 12, 0, 11)


def test_skip_drops_the_missed_slots() -> None:
    # the fleet was down for the five slots 12:00:05 .. 12:00:09
    p = plan("skip", next_run_at=utc(2026, 6, 1, 12, 0, 5))
    assert p.slots == [utc(2026, 6, 1, 12, 0, 10)] and p.missed == 5


def test_run_once_makes_one_job_for_all_the_missed_slots() -> None:
    p = plan("run_once", next_run_at=utc(2026, 6, 1, 12, 0, 5))
    assert p.slots == [utc(2026, 6, 1, 12, 0, 9), utc(2026, 6, 1, 12, 0, 10)] and p.missed == 5


def test_catch_up_makes_every_missed_slot_up_to_max_catch_up() -> None:
    every = plan("catch_up", next_run_at=utc(2026, 6, 1, 12, 0, 5))
    assert every.slots == [utc(2026, 6, 1, 12, 0, s) for s in range(5, 11)] and every.missed == 5
    bounded = plan("catch_up", next_run_at=utc(2026, 6, 1, 12, 0, 5), max_catch_up=2)
    assert bounded.slots == [utc(2026, 6, 1, 12, 0, s) for s in (8, 9, 10)]


def test_catch_up_after_a_long_outage_is_bounded_and_counts_every_missed_slot() -> None:
    p = plan("catch_up", next_run_at=NOW - timedelta(days=30))
    assert len(p.slots) == 11 and p.missed == 30 * 86400 - 1
    cron = plan_tick(SlotSpec("* * * * *", None, "Europe/Berlin"), NOW - timedelta(days=7), NOW,
                     misfire="catch_up", max_catch_up=3, misfire_grace=0, overlap="allow")
    assert len(cron.slots) == 3 and cron.missed == 7 * 24 * 60


def test_slots_passed_while_paused_are_misfires_however_recent() -> None:
    p = plan("skip", next_run_at=utc(2026, 6, 1, 12, 0, 5), grace=60, resumed_at=utc(2026, 6, 1, 12, 0, 10))
    assert p.slots == [utc(2026, 6, 1, 12, 0, 10)] and p.missed == 5


def test_overlap_skip_makes_at_most_the_latest_slot() -> None:
    p = plan("catch_up", next_run_at=utc(2026, 6, 1, 12, 0, 5), overlap="skip")
    assert p.slots == [utc(2026, 6, 1, 12, 0, 10)]


def test_nothing_due_yet_makes_nothing() -> None:
    p = plan("catch_up", next_run_at=utc(2026, 6, 1, 12, 0, 11))
    assert p.slots == [] and p.missed == 0 and p.next_run_at == utc(2026, 6, 1, 12, 0, 11)


def test_ticks_across_the_transitions_make_each_nightly_slot_once() -> None:
    def tick(next_run_at: datetime, now: datetime) -> TickPlan:
        return plan_tick(nightly(), next_run_at, now, misfire="skip", max_catch_up=10, misfire_grace=60,
                         overlap="allow")

    # spring: the missing 02:30 is made at 03:00 CEST, once
    spring = tick(utc(2026, 3, 28, 0, 30), utc(2026, 3, 29, 1, 0, 5))
    assert spring.slots == [utc(2026, 3, 29, 1, 0)] and spring.missed == 1  # 2026-03-28's slot, long past
    assert spring.next_run_at == utc(2026, 3, 30, 0, 30)
    # fall: the first 02:30 (CEST) is made; the second 02:30 (CET) an hour later makes nothing
    first = tick(utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 0, 30, 5))
    assert first.slots == [utc(2026, 10, 25, 0, 30)] and first.next_run_at == utc(2026, 10, 26, 1, 30)
    second = tick(first.next_run_at, utc(2026, 10, 25, 1, 30, 5))
    assert second.slots == [] and second.next_run_at == first.next_run_at
