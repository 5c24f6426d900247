"""Fair share inside a queue with real worker processes (issue 31): a key enqueued behind a backlog starts at
once, weights share the starts, several workers share the same way, and priorities and per-key limits keep
their meaning. The order of starts is read from job_attempts (claim time, then the claim order), first attempts
only: a job whose worker stalled past its lease (a loaded CI machine) runs again when the lease is reaped,
which may be after every other job, and that second start says nothing of the order the claims took. The
workers get a lease long enough that such a stall rarely happens at all (LEASE)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import psycopg
from testkit import query, wait_until

from taskq import SyncJobsClient

NOOP = "test.noop"
SLEEP = "test.sleep"
LEASE = {"lock_timeout": 30.0}


def starts(dsn: str, since: Any = None) -> list[str]:
    """The fairness keys of the jobs started (claimed), in start order; '' for jobs without a key."""
    rows = query(dsn, """
        SELECT coalesce(j.fairness_key, '') FROM taskq.job_attempts AS a JOIN taskq.jobs AS j ON j.id = a.job_id
        WHERE a.attempt = 1 AND (%s::timestamptz IS NULL OR a.started_at >= %s::timestamptz)
        ORDER BY a.started_at, j.priority, j.fair_tag NULLS FIRST, j.scheduled_at, j.id""", since, since)
    return [r[0] for r in rows]


def all_done(dsn: str, total: int) -> bool:
    return query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == [(total,)]


def shares(order: list[str], key: str, window: int = 1000, step: int = 50) -> list[float]:
    return [order[i:i + window].count(key) / window for i in range(0, len(order) - window + 1, step)]


def test_a_key_enqueued_behind_a_backlog_starts_within_150_starts(dsn: str, spawn_worker: Any) -> None:
    sleep = {"seconds": 0.01}
    with SyncJobsClient.connect(dsn) as client:
        client.enqueue_many(SLEEP, [sleep] * 5000, fairness_key="A")
        worker = spawn_worker(concurrency=20, **LEASE)
        worker.worker_id()
        wait_until(lambda: len(starts(dsn)) >= 500, timeout=60)
        client.enqueue_many(SLEEP, [sleep] * 50, fairness_key="B")
    # committed: a claim whose transaction starts from now on sees B's jobs
    (b_enqueued, a_left), = query(dsn, """
        SELECT now(), (SELECT count(*) FROM taskq.jobs WHERE fairness_key = 'A' AND status = 'pending')""")
    assert a_left >= 1000, "A's backlog ran out before B came: the test shows nothing"
    wait_until(lambda: all_done(dsn, 5050), timeout=120)
    # from the first claim after B's commit: one may have run between the commit and our look at the clock
    (first_b,), = query(dsn, """
        SELECT min(a.started_at) FROM taskq.job_attempts AS a JOIN taskq.jobs AS j ON j.id = a.job_id
        WHERE j.fairness_key = 'B'""")
    after = starts(dsn, since=min(first_b, b_enqueued))
    last_b = max(i for i, key in enumerate(after) if key == "B")
    assert after.count("B") == 50
    assert last_b < 150, f"B's last job was start {last_b + 1} after B's enqueue"


def test_weights_share_the_starts_with_one_worker_and_with_three(dsn: str, spawn_worker: Any) -> None:
    for workers in (1, 3):
        query(dsn, "DELETE FROM taskq.job_attempts")
        query(dsn, "DELETE FROM taskq.jobs")
        query(dsn, "INSERT INTO taskq.fairness_weights (queue, key, weight) VALUES ('default', 'A', 3) "
                   "ON CONFLICT DO NOTHING")
        with SyncJobsClient.connect(dsn) as client:
            client.enqueue_many(NOOP, range(3000), fairness_key="A")
            client.enqueue_many(NOOP, range(3000), fairness_key="B")
        procs = [spawn_worker(**LEASE) for _ in range(workers)]
        wait_until(lambda: all_done(dsn, 6000), timeout=120)
        for proc in procs:
            proc.signal(15)
            assert proc.wait(30) == 0
        # both keys are busy until A's last start (about its 3,000th with B's 1,000th): the windows end
        # there, not at a fixed 4,000th start, which with A a little ahead holds B-only starts after it
        order = starts(dsn)
        busy = order[: len(order) - order[::-1].index("A")]
        assert len(busy) >= 3800, (workers, len(busy))
        found = shares(busy, "A")
        assert found and all(0.70 <= s <= 0.80 for s in found), (workers, min(found), max(found))


def test_priorities_and_per_key_limits_keep_their_meaning(dsn: str, spawn_worker: Any) -> None:
    # at most one running job per concurrency key in this queue; A's jobs all share one key
    query(dsn, "INSERT INTO taskq.queues (name, concurrency_per_key) VALUES ('default', 1)")
    job = {"seconds": 0.05}
    with SyncJobsClient.connect(dsn) as client:
        client.enqueue_many(SLEEP, [job] * 40, fairness_key="A", concurrency_key="A")
        client.enqueue_many(SLEEP, [job] * 40, fairness_key="B")
        client.enqueue_many(SLEEP, [job] * 20, fairness_key="C", priority=-1)
    spawn_worker(concurrency=8, **LEASE)
    wait_until(lambda: all_done(dsn, 100), timeout=120)
    order = starts(dsn)
    assert order[:20] == ["C"] * 20  # a lower priority number runs first, whatever the shares
    intervals = query(dsn, """
        SELECT a.started_at, a.finished_at FROM taskq.job_attempts AS a JOIN taskq.jobs AS j ON j.id = a.job_id
        WHERE j.fairness_key = 'A' ORDER BY a.started_at""")
    for (_, end), (start, _) in itertools.pairwise(intervals):
        assert start >= end, "two jobs of key A ran at once under concurrency_per_key=1"
    # A's share is used up by its limit; B takes the slots A cannot use and does not wait for A's 40
    b_last = max(i for i, key in enumerate(order) if key == "B")
    a_last = max(i for i, key in enumerate(order) if key == "A")
    assert b_last < a_last, order
    assert order[b_last + 1:].count("A") >= 20, order


def test_fairness_key_arrives_on_the_job_row(dsn: str) -> None:
    with SyncJobsClient.connect(dsn) as client:
        handle = client.enqueue(NOOP, 1, fairness_key="tenant-7")
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT fairness_key, fair_tag IS NOT NULL, payload FROM taskq.jobs WHERE id = %s",
                           (handle.job_id,)).fetchone()
    assert row == ("tenant-7", True, json.loads("1"))
