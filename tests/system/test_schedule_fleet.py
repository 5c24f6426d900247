"""Exactly one job per schedule slot across a fleet of real worker processes: three workers through a
kill -9 of one of them, and two independent supervisors on one database.

Every wait is on what the database recorded (slot jobs, registered workers), never a sleep; the
assertions are strict on duplicates (none) and on gaps (none between the first slot the fleet made and
the last), which a busy machine cannot break: a slot a tick reaches late is still on time within its
misfire grace (60 s)."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from testkit import query, wait_until

from taskq.invariants import check_invariants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

APP = "taskq_schedule_app:app"
SCHEDULE = "fleet-every-second"
SECOND = timedelta(seconds=1)
APPS = str(Path(__file__).resolve().parent.parent / "apps")


def slots(dsn: str) -> list[datetime]:
    rows = query(dsn, "SELECT scheduled_for FROM taskq.jobs WHERE schedule = %s ORDER BY scheduled_for", SCHEDULE)
    return [r[0] for r in rows]


def db_now(dsn: str) -> datetime:
    value: datetime = query(dsn, "SELECT now()")[0][0]
    return value


def assert_one_job_per_slot_without_gaps(dsn: str, at_least: int) -> list[datetime]:
    made = slots(dsn)
    assert len(made) == len(set(made)), f"duplicate slot jobs: {sorted(s for s in made if made.count(s) > 1)}"
    gaps = [(a, b) for a, b in itertools.pairwise(made) if b - a != SECOND]
    assert not gaps, f"missing slots between {gaps}"
    assert len(made) >= at_least
    report = asyncio.run(_invariants(dsn))
    assert report.by_invariant()["inv_one_job_per_slot"] == 0
    return made


async def _invariants(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await check_invariants(conn)


def test_three_workers_make_exactly_one_job_per_slot_across_a_kill_9(spawn_worker: Any, dsn: str) -> None:
    workers = [spawn_worker(APP, schedule_poll_interval=0.2) for _ in range(3)]
    for w in workers:
        w.worker_id()
    wait_until(lambda: len(slots(dsn)) >= 10, timeout=60)
    victim = workers[1]
    victim.signal(signal.SIGKILL)
    assert victim.wait(10) == -signal.SIGKILL
    killed_at = db_now(dsn)
    # twenty seconds of slots in all, at least eight of them after the kill
    wait_until(lambda: len(slots(dsn)) >= 20 and slots(dsn)[-1] >= killed_at + 8 * SECOND, timeout=90)
    for w in (workers[0], workers[2]):
        w.signal(signal.SIGTERM)
    for w in (workers[0], workers[2]):
        assert w.wait(30) == 0, w.log()
    made = assert_one_job_per_slot_without_gaps(dsn, 20)
    assert made[0] < killed_at < made[-1]


@pytest.fixture
def supervisors(dsn: str, tmp_path: Path) -> Iterator[Any]:
    started: list[subprocess.Popen[bytes]] = []

    def start(workers: int = 2) -> subprocess.Popen[bytes]:
        args = [sys.executable, "-m", "taskq.supervisor", APP, "--workers", str(workers),
                "--kill-grace", "2", "--stop-margin", "2", "--metrics-port", "0",
                "--heartbeat-interval", "0.2", "--lock-timeout", "1.0", "--poll-interval", "0.2",
                "--sweep-interval", "0.3", "--cancellation-grace-period", "0.5", "--cleanup-grace-period", "0.5",
                "--schedule-poll-interval", "0.2"]
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"} | {"TASKQ_DSN": dsn, "PYTHONPATH": APPS}
        with open(tmp_path / f"supervisor-{len(started)}.log", "wb") as log_file:
            proc = subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def test_two_independent_supervisors_on_one_database_make_exactly_one_job_per_slot(
    supervisors: Any, dsn: str, tmp_path: Path
) -> None:
    fleets = [supervisors(), supervisors()]

    def registered() -> bool:
        for proc in fleets:
            assert proc.poll() is None, (tmp_path / "supervisor-0.log").read_text()
        return len(query(dsn, "SELECT id FROM taskq.workers")) == 4

    wait_until(registered, timeout=60)
    start = db_now(dsn)
    wait_until(lambda: bool(slots(dsn)) and slots(dsn)[-1] >= start + 12 * SECOND, timeout=90)
    for proc in fleets:
        proc.send_signal(signal.SIGTERM)
    for proc in fleets:
        assert proc.wait(30) == 0
    assert_one_job_per_slot_without_gaps(dsn, 12)
