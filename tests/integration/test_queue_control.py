"""Queue control against a real PostgreSQL: stats, pause and resume (stored, with events, heard by a
running worker), queue and actor limits in the claim, `taskq queues` / `taskq queue` / `taskq job`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from faces import FACES, client_of
from prometheus_client import REGISTRY
from testkit import running_worker, wait_for

from taskq import JobContext
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend.workers import WorkerStore
from taskq.client import JobsClient
from taskq.exceptions import QueueNotFound
from taskq.invariants import check_invariants
from taskq.models import JobStatus, QueueLimits

pytestmark = pytest.mark.timeout(180)

# leases long enough that a loaded machine cannot take a job away mid-test (nothing here tests leases)
SLOW_LEASES = {"lock_timeout": 15.0, "heartbeat_interval": 1.0}

registry = ActorRegistry()
gate = asyncio.Event()


@actor(name="qci.wait", queue="mail", registry=registry)
async def wait_gate(payload: int, ctx: JobContext[int]) -> int:
    await gate.wait()
    return payload


@actor(name="qci.quick", queue="mail", registry=registry)
async def quick(payload: int, ctx: JobContext[int]) -> int:
    return payload


@actor(name="qci.limited", queue="other", global_concurrency=2, registry=registry)
async def limited(payload: int, ctx: JobContext[int]) -> int:
    await gate.wait()
    return payload


async def fetch(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def running(dsn: str, queue: str) -> int:
    return int((await fetch(dsn, "SELECT count(*) FROM taskq.jobs WHERE queue = %s AND status = 'running'",
                            queue))[0][0])


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKQ_DEBUG"} | {"TASKQ_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


@pytest.fixture(autouse=True)
def closed_gate() -> None:
    global gate
    gate = asyncio.Event()  # an Event binds to the loop of its first wait: one per test


@pytest.fixture(params=FACES)
async def any_client(request: pytest.FixtureRequest, dsn: str) -> AsyncIterator[JobsClient]:
    """The async client, or the sync one seen through tests/faces.py: both faces run each case."""
    async with client_of(request.param, dsn) as c:
        yield c


async def test_queue_stats_count_each_state_and_show_pause_and_limits(dsn: str, any_client: JobsClient) -> None:
    client = any_client
    for i in range(3):
        await client.enqueue("x.a", i, queue="mail")
    await client.enqueue("x.a", 9, queue="mail", scheduled_at=timedelta(hours=1))
    await client.enqueue("x.a", 1, queue="bulk")
    async with await JobsClient.connect(dsn) as claimer:
        store = WorkerStore(claimer.backend, "w-stats")
        await store.register(["mail"], 1, 30)
        (claimed,) = await store.claim(["mail"], 1, 30)
    failed = await client.enqueue("x.a", 2, queue="mail")
    await fetch(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", failed.job_id)
    await client.set_queue_limits("mail", concurrency=5, rate_limit=100, rate_period=60)
    await client.pause_queue("mail", reason="incident", by="ops")
    report = await client.queue_stats()
    mail = report.queue("mail")
    assert (mail.pending, mail.scheduled, mail.running, mail.awaiting_parents, mail.failed_last_hour) == (2, 1, 1, 0, 1)
    assert mail.oldest_pending_age is not None and mail.oldest_pending_age >= 0
    assert mail.throughput == pytest.approx(1 / 300)  # the one failure finished within 5 minutes
    assert mail.paused and mail.paused_by == "ops" and mail.pause_reason == "incident"
    assert mail.limits == QueueLimits(concurrency=5, rate_limit=100, rate_period=60.0)
    bulk = report.queue("bulk")
    assert (bulk.pending, bulk.paused, bulk.limits.any) == (1, False, False)
    assert claimed.queue == "mail"


async def test_pause_is_stored_with_events_and_resume_reports_what_changed(dsn: str, any_client: JobsClient) -> None:
    client = any_client
    await client.enqueue("x.a", 1, queue="mail")
    first = await client.pause_queue("mail", reason="incident 7", by="alice")
    again = await client.pause_queue("mail", reason="incident 7", by="alice")
    assert (first.changed, again.changed) == (True, False)
    resumed = await client.resume_queue("mail", reason="fixed", by="bob")
    assert resumed.changed and not resumed.paused
    events = await fetch(dsn, "SELECT kind, done_by, reason FROM taskq.queue_events WHERE queue = 'mail' ORDER BY id")
    assert events == [("paused", "alice", "incident 7"), ("resumed", "bob", "fixed")]
    with pytest.raises(QueueNotFound, match="no queue named 'ghost'"):
        await client.pause_queue("ghost")
    assert await fetch(dsn, "SELECT name FROM taskq.queues WHERE name = 'ghost'") == []


async def test_a_running_worker_stops_claiming_at_pause_and_resumes_at_once(dsn: str, client: JobsClient) -> None:
    gate.set()
    async with running_worker(dsn, registry, queues=["mail"], concurrency=4, poll_interval=30.0, **SLOW_LEASES):
        first = await client.enqueue(quick, 1)
        await wait_for(lambda: _status(client, first.job_id, JobStatus.SUCCEEDED), timeout=30)
        await client.pause_queue("mail", reason="test")
        held = await client.enqueue(quick, 2)  # enqueue still works; the NOTIFY wakes the worker for nothing
        # the worker's metrics show the pause once it has read it (the pause's NOTIFY made it read again)
        await wait_for(lambda: REGISTRY.get_sample_value("taskq_queue_paused", {"queue": "mail"}) == 1, timeout=20)
        await asyncio.sleep(0)
        row = await client.get(held.job_id)
        assert row is not None and row.row is not None and row.row.status is JobStatus.PENDING
        # the worker polls every 30 s here: only the resume NOTIFY can start the job this soon
        await client.resume_queue("mail")
        await wait_for(lambda: _status(client, held.job_id, JobStatus.SUCCEEDED), timeout=20)
        assert REGISTRY.get_sample_value("taskq_queue_paused", {"queue": "mail"}) == 0
        assert (await client.get(held.job_id)).row.attempt == 1  # type: ignore[union-attr]


async def _status(client: JobsClient, job_id: Any, status: JobStatus) -> bool:
    handle = await client.get(job_id)
    return handle is not None and handle.row is not None and handle.row.status is status


async def test_a_queue_limit_caps_one_worker_and_taskq_job_explains_the_wait(dsn: str, client: JobsClient) -> None:
    await client.set_queue_limits("mail", concurrency=2)
    handles = [await client.enqueue(wait_gate, i) for i in range(5)]
    async with running_worker(dsn, registry, queues=["mail"], concurrency=10, **SLOW_LEASES):
        await wait_for(lambda: _count_is(running(dsn, "mail"), 2), timeout=30)
        waiting = [h for h in handles if (await client.get(h.job_id)).row.status is JobStatus.PENDING]  # type: ignore[union-attr]
        assert len(waiting) == 3
        shown = cli(dsn, "job", str(waiting[0].job_id))
        assert shown.returncode == 0, shown.stderr
        assert "waiting for a concurrency slot of queue mail (2/2 in use)" in shown.stdout
        as_json = json.loads(cli(dsn, "job", str(waiting[0].job_id), "--json").stdout)
        assert as_json["waiting"] == "waiting for a concurrency slot of queue mail (2/2 in use)"
        assert await limit_violations(dsn) == []
        # the invariant checker sees a limit below what runs (an operator lowered it: nothing is stopped)
        await client.set_queue_limits("mail", concurrency=1)
        assert await limit_violations(dsn) == ["queue mail: 2 running, limit 1"]
        # raising the limit is heard at once (NOTIFY), and the worker takes one more
        await client.set_queue_limits("mail", concurrency=3)
        await wait_for(lambda: _count_is(running(dsn, "mail"), 3), timeout=30)
        assert REGISTRY.get_sample_value("taskq_queue_limit", {"queue": "mail", "limit": "concurrency"}) == 3
        gate.set()
        for h in handles:
            await wait_for(lambda h=h: _status(client, h.job_id, JobStatus.SUCCEEDED), timeout=30)
    attempts = await fetch(dsn, "SELECT count(*), max(attempt) FROM taskq.jobs WHERE queue = 'mail'")
    assert attempts == [(5, 1)]  # waiting for a slot spent no attempt


async def limit_violations(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn)
    return [v.detail for v in report.violations if v.invariant == "inv_global_limit"]


async def _count_is(value: Any, expected: int) -> bool:
    return bool(await value == expected)


async def test_an_actor_limit_is_written_by_its_worker_and_holds(dsn: str, client: JobsClient) -> None:
    handles = [await client.enqueue(limited, i) for i in range(4)]
    async with running_worker(dsn, registry, queues=["other"], concurrency=10, **SLOW_LEASES):
        await wait_for(lambda: _count_is(running(dsn, "other"), 2), timeout=30)
        stored = await fetch(dsn, "SELECT actor, global_concurrency FROM taskq.actor_limits")
        assert stored == [("qci.limited", 2)]
        report = await client.queue_stats()
        assert [(a.actor, a.running, a.limits.concurrency) for a in report.actor_limits] == [("qci.limited", 2, 2)]
        shown = cli(dsn, "job", str(handles[3].job_id))
        assert "waiting for a concurrency slot of actor qci.limited (2/2 in use)" in shown.stdout
        gate.set()
        for h in handles:
            await wait_for(lambda h=h: _status(client, h.job_id, JobStatus.SUCCEEDED), timeout=30)


async def test_cli_queues_pause_resume_and_limit(dsn: str, client: JobsClient) -> None:
    await client.enqueue("x.a", 1, queue="mail", concurrency_key="tenant-1")
    assert cli(dsn, "queue", "limit", "mail", "--concurrency", "5", "--per-key", "2", "--rate", "100",
               "--period", "60").stdout.strip() == "mail: concurrency 5, 2 per key, 100 per 60s"
    paused = cli(dsn, "queue", "pause", "mail", "--reason", "incident")
    assert (paused.returncode, paused.stdout.strip()) == (0, "mail: paused")
    table = cli(dsn, "queues").stdout
    assert "mail" in table and "paused by" in table and "concurrency 5, 2 per key, 100 per 60s" in table
    (row,) = json.loads(cli(dsn, "queues", "--json").stdout)["queues"]
    assert (row["name"], row["pending"], row["paused"], row["limits"]["concurrency"]) == ("mail", 1, True, 5)
    assert cli(dsn, "queue", "resume", "mail").stdout.strip() == "mail: resumed"
    assert cli(dsn, "queue", "resume", "mail").stdout.strip() == "mail: already resumed"
    assert cli(dsn, "queue", "limit", "mail", "--rate", "none").stdout.strip() == "mail: concurrency 5, 2 per key"
    unknown = cli(dsn, "queue", "pause", "ghost")
    assert unknown.returncode == 4 and unknown.stderr.startswith("taskq: error: no queue named 'ghost'")
    assert "Traceback" not in unknown.stderr
    wrong = cli(dsn, "queue", "pause", "mail", "--concurrency", "3")
    assert wrong.returncode == 2
    (key,) = (await fetch(dsn, "SELECT concurrency_key FROM taskq.jobs"))[0]
    assert key == "tenant-1"
