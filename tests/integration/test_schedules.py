"""Periodic schedules against a real PostgreSQL, with in-process workers on real time.

Timing never decides an assertion: every expectation is derived from what the database recorded (slot
times, the instant each tick inserted its jobs, the pause and resume instants), and every wait is on a
condition read from the database, with a deadline."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import subprocess
import sys
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from testkit import running_worker, wait_for

from taskq import JobContext, Schedule
from taskq.actors.declaration import Actor, ActorRegistry, actor
from taskq.invariants import check_invariants
from taskq.models import JobStatus

pytestmark = pytest.mark.timeout(120)

SECOND = timedelta(seconds=1)
FAST = {"schedule_poll_interval": 0.2}


async def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def db_now(dsn: str) -> datetime:
    rows = await fetch(dsn, "SELECT now()")
    value: datetime = rows[0][0]
    return value


async def wait_db_clock(dsn: str, at_least: datetime, timeout: float = 30.0) -> None:
    """Wait until the database's clock has reached `at_least` (the clock slots are measured by)."""
    await wait_for(lambda: _clock_past(dsn, at_least), timeout=timeout, interval=0.1)


async def _clock_past(dsn: str, at_least: datetime) -> bool:
    return await db_now(dsn) >= at_least


async def slot_jobs(dsn: str, schedule: str) -> list[tuple[datetime, datetime, str]]:
    """(scheduled_for, created_at, status) of the schedule's slot jobs (not triggers), oldest first."""
    rows = await fetch(
        dsn,
        "SELECT scheduled_for, created_at, status FROM taskq.jobs WHERE schedule = %s AND unique_key IS NOT NULL"
        " ORDER BY scheduled_for",
        schedule,
    )
    return [(r[0], r[1], r[2]) for r in rows]


async def schedule_row(dsn: str, name: str) -> dict[str, Any]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM taskq.schedules WHERE name = %s", (name,))
        row = await cur.fetchone()
    assert row is not None, f"no schedule {name!r}"
    return dict(row)


def tick_app(name: str = "tick", owner: str = "tests", **options: Any) -> tuple[ActorRegistry, list[Any]]:
    """A registry with one no-op async actor and a schedule of it (every second unless told)."""
    reg = ActorRegistry(owner=owner)
    seen: list[Any] = []

    @actor(name="sched.tick", registry=reg)
    async def tick(payload: dict[str, int], ctx: JobContext[dict[str, int]]) -> None:
        seen.append(ctx.scheduled_for)

    options.setdefault("every", SECOND)
    reg.add(Schedule(name=name, actor=tick, payload={"n": 1}, **options))
    return reg, seen


def contiguous(slots: list[datetime], step: timedelta = SECOND) -> bool:
    return all(b - a == step for a, b in itertools.pairwise(slots))


# -- one job per slot -----------------------------------------------------------------------------------


async def test_slot_jobs_carry_their_nominal_time_and_a_retained_slot_key(dsn: str) -> None:
    reg, seen = tick_app()
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: len(seen) >= 3, timeout=20)
    rows = await fetch(dsn, "SELECT scheduled_for, unique_key, unique_scope, status FROM taskq.jobs"
                            " WHERE schedule = 'tick' ORDER BY scheduled_for")
    slots = [r[0] for r in rows]
    assert contiguous(slots) and all(s.microsecond == 0 for s in slots)
    assert set(seen) <= set(slots)  # ctx.scheduled_for is the row's nominal time
    for scheduled_for, key, scope, _ in rows:
        assert key == f"schedule:tick:{scheduled_for.strftime('%Y-%m-%dT%H:%M:%SZ')}" and scope == "retained"
    row = await schedule_row(dsn, "tick")
    assert row["last_run_at"] == slots[-1] and row["last_outcome"] == "enqueued"
    assert row["next_run_at"] > slots[-1]


async def test_a_process_actor_sees_its_slot_in_ctx_scheduled_for(dsn: str) -> None:
    from apps.taskq_schedule_app import slot_in_child

    reg = ActorRegistry([Schedule(name="in-child", actor=slot_in_child, every=SECOND, payload=0)], owner="tests")
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _succeeded(dsn, "in-child"), timeout=40)
    rows = await fetch(dsn, "SELECT scheduled_for, result FROM taskq.jobs WHERE schedule = 'in-child'"
                            " AND status = 'succeeded'")
    assert rows and all(datetime.fromisoformat(result) == scheduled_for for scheduled_for, result in rows)


async def _succeeded(dsn: str, schedule: str) -> bool:
    rows = await fetch(dsn, "SELECT count(*) FROM taskq.jobs WHERE schedule = %s AND status = 'succeeded'", schedule)
    return bool(rows[0][0] >= 1)


async def test_two_schedulers_on_one_database_make_exactly_one_job_per_slot(dsn: str) -> None:
    reg = ActorRegistry(owner="tests")

    @actor(name="sched.noop", registry=reg)
    async def noop(payload: int, ctx: JobContext[int]) -> None:
        return None

    names = [f"every-second-{i}" for i in range(20)]
    for name in names:
        reg.add(Schedule(name=name, actor=noop, every=SECOND, payload=1))
    async with running_worker(dsn, reg, **FAST), running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _min_slots(dsn, names, 6), timeout=40, interval=0.2)
    for name in names:
        slots = [s for s, _, _ in await slot_jobs(dsn, name)]
        assert len(slots) == len(set(slots)) and contiguous(slots), (name, slots)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn)
    assert report.by_invariant()["inv_one_job_per_slot"] == 0


async def _min_slots(dsn: str, names: list[str], n: int) -> bool:
    rows = await fetch(dsn, "SELECT schedule, count(*) FROM taskq.jobs WHERE schedule = ANY(%s) GROUP BY schedule",
                       names)
    return len(rows) == len(names) and min(r[1] for r in rows) >= n


async def test_a_slot_is_never_made_twice_even_when_its_job_is_gone_or_the_row_is_moved_back(dsn: str) -> None:
    reg, _ = tick_app()
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _count(dsn, "tick", 3), timeout=20)
    made = [s for s, _, _ in await slot_jobs(dsn, "tick")]
    # a stale copy of the row (an operator's edit, a scheduler from an old backup) moves next_run_at back:
    # the slots whose jobs are still stored keep their one job (the retained unique key)
    await fetch(dsn, "UPDATE taskq.schedules SET next_run_at = %s WHERE name = 'tick'", made[0])
    # retention deletes the oldest slot job: the schedule's own bookkeeping never goes back to it
    await fetch(dsn, "DELETE FROM taskq.jobs WHERE schedule = 'tick' AND scheduled_for = %s", made[0])
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _count(dsn, "tick", len(made) + 2), timeout=20)
    after = [s for s, _, _ in await slot_jobs(dsn, "tick")]
    assert len(after) == len(set(after))
    assert all(after.count(s) == 1 for s in made[1:])
    row = await schedule_row(dsn, "tick")
    assert row["next_run_at"] > after[-1]


async def _count(dsn: str, schedule: str, n: int) -> bool:
    return len(await slot_jobs(dsn, schedule)) >= n


async def test_a_schedule_row_this_host_cannot_compute_does_not_stop_the_others(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    reg, _ = tick_app()
    # as a newer taskq, or a host with other zone data, might have stored it
    await fetch(dsn, "INSERT INTO taskq.schedules (name, actor, queue, cron, timezone, definition, next_run_at, owner)"
                     " VALUES ('alien', 'sched.tick', 'default', '0 3 * * *', 'Nowhere/Atlantis', 'x', now(), 'other')")
    with caplog.at_level(logging.ERROR, logger="taskq.scheduler"):
        async with running_worker(dsn, reg, **FAST):
            await wait_for(lambda: _count(dsn, "tick", 3), timeout=20)
    assert "schedule alien: cannot compute its slots here" in caplog.text
    assert await slot_jobs(dsn, "alien") == []


# -- misfires: the fleet stopped for at least five slots -------------------------------------------------

GRACE = 2.0


@pytest.mark.parametrize(("misfire", "max_catch_up"), [("skip", 10), ("run_once", 10), ("catch_up", 3),
                                                       ("catch_up", 10)])
async def test_misfire_policy_after_the_fleet_was_stopped_for_five_slots(
    dsn: str, misfire: str, max_catch_up: int
) -> None:
    reg, _ = tick_app(misfire=misfire, max_catch_up=max_catch_up, misfire_grace=GRACE)
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _count(dsn, "tick", 2), timeout=20)
    before = await slot_jobs(dsn, "tick")
    last = before[-1][0]
    # nothing runs now: let the database's clock pass eight slots, so at least five are older than the grace
    await wait_db_clock(dsn, last + 8 * SECOND)
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _count(dsn, "tick", len(before) + 1), timeout=20)
    after = await slot_jobs(dsn, "tick")
    new = [(s, c) for s, c, _ in after if s > last]
    restart_tick = min(c for _, c in new)  # created_at is the first tick's transaction time
    cutoff = restart_tick - timedelta(seconds=GRACE)
    missed_slots = [last + k * SECOND for k in range(1, 100) if last + k * SECOND < cutoff]
    assert len(missed_slots) >= 5
    made_for_missed = [s for s, _ in new if s < cutoff]
    assert all(c == restart_tick for s, c in new if s < cutoff)  # all of them by the restart's first tick
    if misfire == "skip":
        assert made_for_missed == []
    elif misfire == "run_once":
        assert made_for_missed == [missed_slots[-1]]
    else:
        assert made_for_missed == missed_slots[-max_catch_up:]
    # the slots from the restart on all ran, one job each
    on_time = [s for s, _ in new if s >= cutoff]
    assert on_time and contiguous(on_time) and on_time[0] - SECOND < cutoff
    row = await schedule_row(dsn, "tick")
    assert row["missed_total"] >= len(missed_slots)


# -- overlap ------------------------------------------------------------------------------------------------


async def test_overlap_skip_makes_no_slot_job_while_the_previous_one_runs(dsn: str) -> None:
    reg = ActorRegistry(owner="tests")
    release = asyncio.Event()
    started: list[datetime] = []

    @actor(name="sched.slow", registry=reg)
    async def slow(payload: int, ctx: JobContext[int]) -> None:
        assert ctx.scheduled_for is not None
        started.append(ctx.scheduled_for)
        await release.wait()

    reg.add(Schedule(name="slow", actor=slow, every=SECOND, payload=1, overlap="skip"))
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: started, timeout=20)
        first = started[0]
        await wait_db_clock(dsn, first + 4 * SECOND)
        await wait_for(lambda: _outcome(dsn, "slow", "skipped_overlap"), timeout=10)
        assert [s for s, _, _ in await slot_jobs(dsn, "slow")] == [first]  # three slots passed, no job
        release.set()
        await wait_for(lambda: len(started) >= 3, timeout=20)
    jobs = await fetch(dsn, "SELECT scheduled_for, started_at, finished_at FROM taskq.jobs WHERE schedule = 'slow'"
                            " AND finished_at IS NOT NULL ORDER BY scheduled_for")
    assert jobs[1][0] >= first + 4 * SECOND
    assert all(a[2] <= b[1] for a, b in itertools.pairwise(jobs))  # never two at once


async def _outcome(dsn: str, name: str, outcome: str) -> bool:
    return bool((await schedule_row(dsn, name))["last_outcome"] == outcome)


# -- runtime management through the CLI -------------------------------------------------------------------


def run_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_DEBUG")} | {"TASKQ_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


async def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, dsn, *args)  # the worker under test shares this event loop


async def test_pause_resume_and_trigger_through_the_cli(dsn: str) -> None:
    import json

    reg, _ = tick_app()
    async with running_worker(dsn, reg, **FAST):
        await wait_for(lambda: _count(dsn, "tick", 2), timeout=20)
        paused = await cli(dsn, "schedule", "pause", "tick")
        assert (paused.returncode, paused.stdout.strip(), paused.stderr) == (0, "tick: paused", "")
        again = await cli(dsn, "schedule", "pause", "tick")
        assert again.stdout.strip() == "tick: already paused"
        paused_at = (await schedule_row(dsn, "tick"))["paused_at"]
        await wait_db_clock(dsn, paused_at + 3 * SECOND)
        assert max(s for s, _, _ in await slot_jobs(dsn, "tick")) < paused_at

        listed = json.loads((await cli(dsn, "schedules", "--json")).stdout)
        assert [(s["name"], s["paused"], s["enabled"], s["every_seconds"]) for s in listed] == [
            ("tick", True, True, 1)
        ]
        table = (await cli(dsn, "schedules")).stdout
        assert "tick" in table and "every 1s" in table and "paused" in table

        triggered = await cli(dsn, "schedule", "trigger", "tick", "--json")
        assert triggered.returncode == 0, triggered.stderr
        made = json.loads(triggered.stdout)
        await wait_for(lambda: _status(dsn, made["job_id"], JobStatus.SUCCEEDED), timeout=20)
        trig = await fetch(dsn, "SELECT scheduled_for, unique_key FROM taskq.jobs WHERE id = %s", made["job_id"])
        assert trig[0][0].microsecond != 0 and trig[0][1] is None  # outside the slot sequence

        resumed = await cli(dsn, "schedule", "resume", "tick")
        assert resumed.stdout.strip() == "tick: resumed"
        resumed_at = (await schedule_row(dsn, "tick"))["resumed_at"]
        await wait_for(lambda: _slot_after(dsn, "tick", resumed_at), timeout=20)
    slots = [s for s, _, _ in await slot_jobs(dsn, "tick")]
    assert not [s for s in slots if paused_at <= s < resumed_at]  # skip: the paused slots never ran
    assert len(slots) == len(set(slots))


async def _status(dsn: str, job_id: str, status: JobStatus) -> bool:
    rows = await fetch(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", job_id)
    return bool(rows) and rows[0][0] == status.value


async def _slot_after(dsn: str, schedule: str, t: datetime) -> bool:
    return any(s >= t for s, _, _ in await slot_jobs(dsn, schedule))


async def test_cli_names_an_unknown_schedule_not_found_and_a_bad_name_a_usage_error(dsn: str) -> None:
    for action in ("pause", "resume", "trigger"):
        missing = await cli(dsn, "schedule", action, "nope")
        assert missing.returncode == 4 and missing.stdout == ""
        assert missing.stderr.strip() == "taskq: error: no schedule named 'nope'"
    bad = await cli(dsn, "schedule", "pause", "x" * 300)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    wrong = await cli(dsn, "schedule", "stop", "tick")
    assert wrong.returncode == 2 and "invalid choice" in wrong.stderr
    assert (await fetch(dsn, "SELECT count(*) FROM taskq.schedules"))[0][0] == 0


# -- declarations at restart ------------------------------------------------------------------------------


def app(*schedules: tuple[str, dict[str, Any]]) -> tuple[ActorRegistry, Actor[Any, Any]]:
    reg = ActorRegistry(owner="reports-app")

    @actor(name="sched.report", registry=reg)
    async def report(payload: dict[str, str], ctx: JobContext[dict[str, str]]) -> None:
        return None

    for name, options in schedules:
        reg.add(Schedule(name=name, actor=report, **options))
    return reg, report


async def test_a_changed_expression_moves_the_next_slot_and_a_schedule_gone_from_code_is_disabled(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    hourly = {"cron": "0 * * * *", "payload": {"kind": "hourly"}}
    nightly = {"cron": "0 3 * * *", "timezone": "Europe/Berlin", "payload": {"kind": "nightly"}}
    first, _ = app(("hourly", hourly), ("nightly", nightly))
    async with running_worker(dsn, first, **FAST) as worker:
        await asyncio.wait_for(worker.parts.scheduler.synced.wait(), 10)
    before = await schedule_row(dsn, "hourly")
    assert before["owner"] == "reports-app" and before["next_run_at"].minute == 0

    # a new payload keeps the slots; a new expression moves the next slot; nightly is gone from the code
    second, _ = app(("hourly", {"cron": "30 * * * *", "payload": {"kind": "half past"}}))
    with caplog.at_level(logging.INFO, logger="taskq.scheduler"):
        async with running_worker(dsn, second, **FAST) as worker:
            await asyncio.wait_for(worker.parts.scheduler.synced.wait(), 10)
    moved = await schedule_row(dsn, "hourly")
    assert moved["cron"] == "30 * * * *" and moved["payload"] == {"kind": "half past"}
    assert moved["next_run_at"].minute == 30 and moved["next_run_at"] != before["next_run_at"]
    gone = await schedule_row(dsn, "nightly")
    assert gone["enabled"] is False  # disabled, not deleted
    assert "no longer declared, disabled (not deleted): nightly" in caplog.text
    assert "next slot moved): hourly" in caplog.text

    third, _ = app(("hourly", {"cron": "30 * * * *", "payload": {"kind": "again"}}), ("nightly", nightly))
    async with running_worker(dsn, third, **FAST) as worker:
        await asyncio.wait_for(worker.parts.scheduler.synced.wait(), 10)
    kept = await schedule_row(dsn, "hourly")
    assert kept["next_run_at"] == moved["next_run_at"] and kept["payload"] == {"kind": "again"}
    back = await schedule_row(dsn, "nightly")
    assert back["enabled"] is True and back["resumed_at"] is not None


async def test_another_applications_worker_leaves_its_schedules_alone(dsn: str) -> None:
    mine, _ = app(("hourly", {"cron": "0 * * * *", "payload": {"kind": "hourly"}}))
    async with running_worker(dsn, mine, **FAST) as worker:
        await asyncio.wait_for(worker.parts.scheduler.synced.wait(), 10)
    other = ActorRegistry(owner="billing-app")
    async with running_worker(dsn, other, **FAST) as worker:
        await asyncio.wait_for(worker.parts.scheduler.synced.wait(), 10)
    assert (await schedule_row(dsn, "hourly"))["enabled"] is True
