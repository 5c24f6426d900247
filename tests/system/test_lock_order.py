"""Lock order (issue 33): bulk cancels and requeues run for a minute against three worker processes
draining the same jobs. Every statement that locks several job rows takes them in id order, so they wait
for each other and never deadlock: no worker logs a deadlock, and PostgreSQL counts none."""

from __future__ import annotations

import asyncio
import random
import signal
import time
from typing import Any

import pytest
from testkit import query

from taskq import JobsClient
from taskq.models import JobFilter, JobStatus

pytestmark = pytest.mark.timeout(300)

DURATION = 60.0


def deadlocks(dsn: str) -> int:
    return int(query(dsn, "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")[0][0])


async def test_bulk_cancels_and_requeues_against_a_draining_fleet_never_deadlock(
        dsn: str, client: JobsClient, spawn_worker: Any) -> None:
    rng = random.Random(33)
    # small finish batches from many concurrent jobs: the finishes of one worker interleave with every
    # bulk statement, in many orders
    workers = [spawn_worker(concurrency=200, claim_batch_size=50, lock_timeout=30.0, heartbeat_interval=1.0)
               for _ in range(3)]
    for w in workers:
        w.worker_id()
    before = deadlocks(dsn)
    deadline = time.monotonic() + DURATION
    rounds = cancelled = requeued = 0
    while time.monotonic() < deadline:
        for w in workers:
            assert w.proc.poll() is None, w.log()
        # jobs that end in an order unrelated to their ids, so each finish batch holds ids in any order
        await client.enqueue_many("test.sleep", [{"seconds": rng.uniform(0.0, 0.2)} for _ in range(400)])
        await client.enqueue_many("test.echo_fail", [{"n": str(i)} for i in range(100)])
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        # running and waiting ones alike, in whatever order the workers finish theirs
        result = await client.cancel_where(JobFilter(actors=["test.sleep"],
                                                     statuses=[JobStatus.PENDING, JobStatus.RUNNING]),
                                           batch_size=rng.choice([50, 200, 1000]))
        cancelled += result.total
        requeue = await client.requeue_where(JobFilter(actors=["test.echo_fail"]), attempts=1,
                                             batch_size=rng.choice([50, 200, 1000]))
        requeued += len(requeue.job_ids)
        rounds += 1
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(60) == 0, w.log()
    logs = "\n".join(w.log() for w in workers)
    assert "deadlock" not in logs.lower(), [line for line in logs.splitlines() if "deadlock" in line.lower()][:5]
    assert deadlocks(dsn) == before, f"{deadlocks(dsn) - before} deadlocks in {rounds} rounds"
    assert rounds >= 10 and cancelled > 0 and requeued > 0, (rounds, cancelled, requeued)
