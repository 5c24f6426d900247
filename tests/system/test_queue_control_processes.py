"""Queue control across real worker processes: fleet-wide concurrency limits (per queue, per key, per
actor), rate limits, pause and resume during a drain, and slots coming back after a kill -9.

The limits are checked from the database itself: a sampler reads the running rows every 5 ms while the
fleet drains, and the starts are read back from `started_at`."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Json
from testkit import query, wait_until

from taskq import JobsClient

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

APP = "taskq_queue_control_app:actors"


def insert_jobs(dsn: str, actor: str, queue: str, payload: Any, n: int, *, keys: list[str] | None = None) -> None:
    """`n` due jobs in one statement (keys: the concurrency key of job i is keys[i % len(keys)]), then the
    NOTIFY that wakes the queue's workers."""
    query(
        dsn,
        "INSERT INTO taskq.jobs (actor, queue, payload, concurrency_key) "
        "SELECT %s, %s, %s::jsonb, CASE WHEN %s::text[] IS NULL THEN NULL "
        "ELSE (%s::text[])[1 + (i %% cardinality(%s::text[]))] END FROM generate_series(0, %s - 1) AS i",
        actor, queue, Json(payload), keys, keys, keys, n,
    )
    query(dsn, "SELECT pg_notify('taskq_jobs', %s)", queue)


def set_limits(dsn: str, queue: str, **limits: Any) -> None:
    async def go() -> None:
        async with await JobsClient.connect(dsn) as client:
            await client.set_queue_limits(queue, **limits)

    asyncio.run(go())


class Sampler:
    """Reads `sql` (one row of integers) every 5 ms on its own thread and keeps the highest values."""

    def __init__(self, dsn: str, sql: str, *params: Any) -> None:
        self.dsn, self.sql, self.params = dsn, sql, params
        self.highest: list[int] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(self.sql, self.params).fetchone()
                values = [int(v or 0) for v in (row or ())]
                if self.highest:
                    values = [max(a, b) for a, b in zip(self.highest, values, strict=True)]
                self.highest = values
                self.samples += 1
                self._stop.wait(0.005)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def count(dsn: str, sql: str, *params: Any) -> int:
    return int(query(dsn, sql, *params)[0][0])


@pytest.fixture
def fleet(spawn_worker: Any) -> Iterator[Callable[..., list[Any]]]:
    def start(n: int, **settings: Any) -> list[Any]:
        workers = [spawn_worker(APP, **settings) for _ in range(n)]
        for w in workers:
            w.worker_id()
        return workers

    yield start


def test_queue_limit_of_3_holds_across_4_workers_of_20_and_every_job_runs_once(dsn: str, fleet: Any) -> None:
    set_limits(dsn, "limited", concurrency=3)
    insert_jobs(dsn, "qc.short", "limited", 0.01, 2000)  # 10 ms: an overshoot would last long enough to be seen
    with Sampler(dsn, "SELECT count(*) FROM taskq.jobs WHERE queue = 'limited' AND status = 'running'") as s:
        fleet(4, queues=["limited"], concurrency=20)
        wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == 2000,
                   timeout=240)
    assert s.samples > 100
    assert s.highest == [3]  # reached, never passed
    assert count(dsn, "SELECT count(*) FROM taskq.jobs WHERE attempt <> 1 OR status <> 'succeeded'") == 0
    assert count(dsn, "SELECT count(*) FROM taskq.job_attempts") == 2000
    assert count(dsn, "SELECT count(DISTINCT worker_id) FROM taskq.job_attempts") >= 1


def test_ten_tenants_with_two_slots_each_never_pass_two_and_a_full_tenant_blocks_nobody(
    dsn: str, fleet: Any
) -> None:
    # tenant 0's backlog comes first in the queue: the other tenants must not wait behind it
    insert_jobs(dsn, "qc.tenant", "tenants", 0.02, 40, keys=["tenant-0"])
    insert_jobs(dsn, "qc.tenant", "tenants", 0.02, 180, keys=[f"tenant-{i}" for i in range(1, 10)])
    per_key = ("SELECT max(n), sum(n) FROM (SELECT count(*) AS n FROM taskq.jobs WHERE queue = 'tenants' "
               "AND status = 'running' GROUP BY concurrency_key) AS k")
    with Sampler(dsn, per_key) as s:
        fleet(2, queues=["tenants"], concurrency=20)
        wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == 220,
                   timeout=240)
    assert s.highest[0] == 2
    assert count(dsn, "SELECT count(*) FROM taskq.jobs WHERE attempt <> 1") == 0
    # other tenants ran while tenant 0 still had jobs waiting
    (last_t0,) = query(dsn, "SELECT max(started_at) FROM taskq.jobs WHERE concurrency_key = 'tenant-0'")[0]
    assert count(dsn, "SELECT count(*) FROM taskq.jobs WHERE concurrency_key <> 'tenant-0' AND started_at < %s",
                 last_t0) > 100


def test_rate_of_50_per_second_never_has_more_than_50_starts_in_any_second(dsn: str, fleet: Any) -> None:
    total = 600  # 12 s at 50 per second
    insert_jobs(dsn, "qc.rated", "rated", 1, total)
    fleet(2, queues=["rated"], concurrency=20)
    wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == total,
               timeout=240)
    starts: list[datetime] = [r[0] for r in query(dsn, "SELECT started_at FROM taskq.jobs ORDER BY started_at")]
    assert count(dsn, "SELECT count(*) FROM taskq.jobs WHERE attempt <> 1") == 0
    # every window [t, t + 1 s) that starts at a start holds at most 50 (the densest windows start at one)
    j = 0
    densest = 0
    for i, t in enumerate(starts):
        while j < len(starts) and starts[j] < t + timedelta(seconds=1):
            j += 1
        densest = max(densest, j - i)
    assert densest <= 50
    span = (starts[-1] - starts[0]).total_seconds()
    assert span >= (total - 50) / 50 * 0.999  # the limit did bind: 600 starts need at least 11 s
    print(f"rate limit held: densest second {densest} starts, {total} starts over {span:.1f}s "
          f"({total / span:.1f}/s)")


def test_pause_stops_every_worker_within_100ms_resume_restarts_and_a_worker_started_paused_claims_nothing(
    dsn: str, fleet: Any, spawn_worker: Any
) -> None:
    insert_jobs(dsn, "qc.drain", "drain", 0.01, 4000)
    fleet(2, queues=["drain"], concurrency=5)
    wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") >= 100)

    async def pause() -> datetime:
        async with await JobsClient.connect(dsn) as client:
            await client.pause_queue("drain", reason="incident 42", by="oncall")
            async with client.backend.pool.connection() as conn:
                cur = await conn.execute("SELECT clock_timestamp()")
                row = await cur.fetchone()
                assert row is not None
                return row[0]  # type: ignore[no-any-return]

    committed_by = asyncio.run(pause())
    # the jobs running at the pause go on and finish; nothing starts after it
    wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'running'") == 0)
    (last_start,) = query(dsn, "SELECT max(started_at) FROM taskq.jobs")[0]
    assert last_start <= committed_by + timedelta(milliseconds=100)
    waiting = count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'pending'")
    assert waiting > 0
    # enqueue still works while paused
    insert_jobs(dsn, "qc.drain", "drain", 0.01, 10)
    # a worker started while paused reads the pause and claims nothing; its heartbeat going on twice
    # shows it ran through its claim loop meanwhile (poll_interval 0.2 s, heartbeat 0.2 s)
    late = spawn_worker(APP, queues=["drain"], concurrency=5)
    late_id = late.worker_id()
    wait_until(lambda: "paused queues of this worker: ['drain']" in late.log())
    (beat,) = query(dsn, "SELECT last_heartbeat_at FROM taskq.workers WHERE id = %s", late_id)[0]
    wait_until(lambda: query(dsn, "SELECT last_heartbeat_at FROM taskq.workers WHERE id = %s",
                             late_id)[0][0] > beat + timedelta(seconds=0.4))
    assert count(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE started_at > %s", committed_by
                 + timedelta(milliseconds=100)) == 0
    events = query(dsn, "SELECT kind, done_by, reason FROM taskq.queue_events WHERE queue = 'drain' ORDER BY id")
    assert events == [("paused", "oncall", "incident 42")]

    async def resume() -> None:
        async with await JobsClient.connect(dsn) as client:
            await client.resume_queue("drain", reason="fixed", by="oncall")

    asyncio.run(resume())
    wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == 4010,
               timeout=240)
    assert count(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE worker_id = %s", late_id) > 0
    assert query(dsn, "SELECT kind FROM taskq.queue_events WHERE queue = 'drain' ORDER BY id") == [
        ("paused",), ("resumed",)]


def test_slots_held_by_a_killed_worker_come_back_at_reclaim(dsn: str, fleet: Any) -> None:
    insert_jobs(dsn, "qc.held", "held", 120.0, 6)
    running = "SELECT count(*) FROM taskq.jobs WHERE actor = 'qc.held' AND status = 'running'"
    with Sampler(dsn, running) as s:
        (first,) = fleet(1, queues=["held"], concurrency=10)
        first_id = first.worker_id()
        wait_until(lambda: count(dsn, running) == 3)
        (second,) = fleet(1, queues=["held"], concurrency=10)
        second_id = second.worker_id()
        # the second worker gets nothing while the first holds the three slots
        wait_until(lambda: query(dsn, "SELECT last_heartbeat_at - started_at FROM taskq.workers WHERE id = %s",
                                 second_id)[0][0] > timedelta(seconds=0.6))
        assert count(dsn, "SELECT count(*) FROM taskq.jobs WHERE worker_id = %s AND status = 'running'",
                     second_id) == 0
        first.signal(signal.SIGKILL)
        first.wait(10)
        # the sweeper reclaims the three rows (lease 1 s), their retry comes due, the second worker takes
        # the slots they gave back
        wait_until(lambda: count(dsn, "SELECT count(*) FROM taskq.jobs WHERE worker_id = %s AND status = 'running'",
                                 second_id) == 3, timeout=60)
    assert s.highest == [3]
    assert count(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE worker_id = %s AND outcome = 'crashed'",
                 first_id) == 3
