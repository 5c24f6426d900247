"""Operator requeue against a real PostgreSQL and real in-process workers."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFailed, JobFilter, JobsClient, JobStatus, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.exceptions import ConfigurationError
from taskq.invariants import check_invariants

pytestmark = pytest.mark.timeout(90)

FAST_RETRY = RetryPolicy(base=0.05, jitter=0)


async def assert_invariants_hold(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


async def ended(client: JobsClient, job_id: Any) -> Any:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row if handle.row.is_terminal else None


async def test_a_failed_job_reruns_at_attempt_n_plus_one_and_succeeds(dsn: str) -> None:
    reg = ActorRegistry()
    broken = {"yes": True}

    @actor(name="deploy.fixes.me", registry=reg, max_attempts=2, retry=FAST_RETRY)
    async def fixable(payload: int, ctx: JobContext[int]) -> dict[str, Any]:
        before = ctx.last_progress
        await ctx.progress({"seen": ctx.attempt})
        if broken["yes"]:
            raise RuntimeError(f"bug in attempt {ctx.attempt}")
        return {"attempt": ctx.attempt, "progress_before": before}

    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg):
        handle = await client.enqueue(fixable, 1)
        with pytest.raises(JobFailed):
            await handle.wait(timeout=20)
        failed = await handle.refresh()
        assert (failed.status, failed.attempt, failed.claim_epoch, failed.max_attempts) == ("failed", 2, 2, 2)
        broken["yes"] = False
        result = await client.requeue(handle.job_id, reason="fixed in v2")
        assert result.model_dump() == {
            "job_id": handle.job_id, "previous_status": JobStatus.FAILED, "new_status": JobStatus.PENDING,
            "requeued": True, "conflict_job_id": None, "revived": (),
        }
        row = await handle.wait(timeout=20)
    assert row.status is JobStatus.SUCCEEDED
    assert (row.attempt, row.claim_epoch, row.max_attempts, row.requeue_count) == (3, 3, 4, 1)
    assert row.result == {"attempt": 3, "progress_before": {"seen": 2}}  # progress kept across the requeue
    assert row.error_class is None and row.error_message is None
    history = await _attempts(dsn, handle.job_id)
    assert history == [(1, 1, "retried"), (2, 2, "failed"), (3, 3, "succeeded")]
    events = await _events(dsn, handle.job_id)
    requeued = [e for e in events if e[0] == "requeued"]
    assert len(requeued) == 1
    _kind, from_status, to_status, attempt, detail = requeued[0]
    assert (from_status, to_status, attempt) == ("failed", "pending", 2)
    assert detail["reason"] == "fixed in v2" and detail["origin"] == "operator"
    assert detail["max_attempts_from"] == 2 and detail["max_attempts_to"] == 4 and detail["claim_epoch"] == 2
    assert detail["error_class"] == "RuntimeError"
    await assert_invariants_hold(dsn)


async def _attempts(dsn: str, job_id: Any) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT attempt, claim_epoch, outcome FROM taskq.job_attempts WHERE job_id = %s "
                      "ORDER BY claim_epoch", job_id)


async def _events(dsn: str, job_id: Any) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT kind, from_status, to_status, attempt, detail FROM taskq.job_events "
                      "WHERE job_id = %s ORDER BY id", job_id)


async def test_requeue_of_a_succeeded_cancelled_pending_or_unknown_job_changes_nothing(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="fine", registry=reg)
    async def fine(payload: int, ctx: JobContext[int]) -> int:
        return payload

    async with await JobsClient.connect(dsn, registry=reg) as client:
        async with running_worker(dsn, reg):
            done = await client.enqueue(fine, 1)
            await done.wait(timeout=20)
        cancelled = await client.enqueue(fine, 2)
        await client.cancel(cancelled.job_id, reason="not wanted")
        waiting = await client.enqueue(fine, 3)
        before = query(dsn, "SELECT * FROM taskq.jobs ORDER BY id")
        events_before = query(dsn, "SELECT count(*) FROM taskq.job_events")
        for handle, status in ((done, "succeeded"), (cancelled, "cancelled"), (waiting, "pending")):
            result = await client.requeue(handle.job_id, reason="try")
            assert (result.requeued, result.previous_status, result.new_status) == (False, status, status)
            assert result.conflict_job_id is None
        assert query(dsn, "SELECT * FROM taskq.jobs ORDER BY id") == before
        assert query(dsn, "SELECT count(*) FROM taskq.job_events") == events_before
        with pytest.raises(KeyError):
            await client.requeue(uuid4())
        with pytest.raises(ConfigurationError, match="not a job id"):
            await client.requeue("not-a-uuid")
        for bad in (0, -1, True, 1.5, 2_000_000):
            with pytest.raises(ConfigurationError, match="attempts must be an int"):
                await client.requeue(done.job_id, attempts=bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="reason"):
            await client.requeue(done.job_id, reason="nul\x00")
        with pytest.raises(ConfigurationError, match="empty filter"):
            await client.requeue_where(JobFilter())


async def test_a_unique_conflict_leaves_the_row_unchanged_and_names_the_holder(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="always.fails", registry=reg, max_attempts=1)
    async def always_fails(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("no")

    async with await JobsClient.connect(dsn, registry=reg) as client:
        async with running_worker(dsn, reg):
            first = await client.enqueue(always_fails, 1, unique_key="nightly")
            await wait_for(lambda: ended(client, first.job_id), timeout=20)
        # the failed job freed its key (scope active): a new job took it
        holder = await client.enqueue("always.fails", 2, unique_key="nightly")
        assert holder.created
        before = query(dsn, "SELECT * FROM taskq.jobs WHERE id = %s", first.job_id)
        result = await client.requeue(first.job_id, reason="retry it")
        assert (result.requeued, result.new_status, result.conflict_job_id) == (False, "failed", holder.job_id)
        assert query(dsn, "SELECT * FROM taskq.jobs WHERE id = %s", first.job_id) == before
        bulk = await client.requeue_where(JobFilter(actors=("always.fails",)))
        assert bulk.total == 0 and bulk.conflicts == {first.job_id: holder.job_id}
        # once the holder is gone the key is free again
        await client.cancel(holder.job_id)
        again = await client.requeue(first.job_id, attempts=5)
        assert again.requeued and again.new_status is JobStatus.PENDING
        row = await first.refresh()
        assert row.max_attempts == 6 and row.unique_key == "nightly" and row.requeue_count == 1
        dup = await client.enqueue("always.fails", 3, unique_key="nightly")
        assert dup.created is False and dup.job_id == first.job_id


async def test_a_retained_row_keeps_its_key_across_its_own_requeue(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="kept.fails", registry=reg, max_attempts=1)
    async def kept_fails(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("no")

    async with running_worker(dsn, reg):
        kept = await client.enqueue("kept.fails", 1, unique_key="once", unique_scope="retained", max_attempts=1)
        await wait_for(lambda: ended(client, kept.job_id), timeout=20)
    result = await client.requeue(kept.job_id)
    assert result.requeued and result.conflict_job_id is None
    row = await kept.refresh()
    assert row.max_attempts == 2  # the actor is not registered in this client: the job's own budget again


async def test_bulk_requeue_by_tag_in_batches_counts_by_previous_status(dsn: str) -> None:
    reg = ActorRegistry()
    fail = {"yes": True}

    @actor(name="bulk.job", registry=reg, max_attempts=1)
    async def bulk_job(payload: int, ctx: JobContext[int]) -> int:
        if fail["yes"]:
            raise ValueError("down")
        return payload

    async with await JobsClient.connect(dsn, registry=reg) as client, running_worker(dsn, reg, concurrency=10):
        tagged = await client.enqueue_many(bulk_job, list(range(7)), tags=("tenant-a",))
        other = await client.enqueue_many(bulk_job, [100, 101], tags=("tenant-b",))
        unknown = await client.enqueue("no.such.actor", 5, tags=("tenant-a",))  # fails UnknownActor
        for h in [*tagged, *other, unknown]:
            await wait_for(lambda h=h: ended(client, h.job_id), timeout=30)
        fine = await client.enqueue(bulk_job, 0, tags=("tenant-a",))
        fail["yes"] = False
        await fine.wait(timeout=20)
        seen: list[int] = []
        bulk = await client.requeue_where(
            JobFilter(tags=("tenant-a",)), reason="upstream back", batch_size=3, progress=seen.append
        )
        assert bulk.by_previous_status == {JobStatus.FAILED: 8} and bulk.total == 8
        assert set(bulk.job_ids) == {h.job_id for h in tagged} | {unknown.job_id}
        assert bulk.batches == 3 and seen == [3, 6, 8] and bulk.conflicts == {}
        for h in tagged:
            assert (await h.wait(timeout=20)).attempt == 2
        assert {r.status for r in await client.list_jobs(JobFilter(tags=("tenant-b",)))} == {JobStatus.FAILED}
        await wait_for(lambda: ended(client, unknown.job_id), timeout=20)  # no worker knows it: failed again
        again = await client.requeue_where(JobFilter(tags=("tenant-a",)))
        assert again.job_ids == (unknown.job_id,) and again.by_previous_status == {JobStatus.FAILED: 1}
    await assert_invariants_hold(dsn)


async def test_bulk_requeue_of_two_failed_jobs_sharing_a_key_requeues_only_the_first(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()

    @actor(name="twin", registry=reg, max_attempts=1)
    async def twin(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError("no")

    async with running_worker(dsn, reg):
        a = await client.enqueue("twin", 1, unique_key="same")
        await wait_for(lambda: ended(client, a.job_id), timeout=20)
        b = await client.enqueue("twin", 2, unique_key="same")
        assert b.created
        await wait_for(lambda: ended(client, b.job_id), timeout=20)
    for batch_size in (10, 1):
        query(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE status = 'pending'")
        bulk = await client.requeue_where(JobFilter(actors=("twin",)), batch_size=batch_size)
        assert bulk.total == 1 and len(bulk.conflicts) == 1
        (loser, winner) = next(iter(bulk.conflicts.items()))
        assert bulk.job_ids == (winner,) and {loser, winner} == {a.job_id, b.job_id}


async def test_concurrent_requeues_of_jobs_sharing_a_key_leave_one_live(dsn: str, client: JobsClient) -> None:
    """The holder check runs on the statement's snapshot; the partial unique index settles the race."""
    ids = [r[0] for r in query(
        dsn,
        "INSERT INTO taskq.jobs (actor, status, finished_at, unique_key, unique_scope, error_class) "
        "SELECT 'race', 'failed', now(), 'shared', 'active', 'Boom' FROM generate_series(1, 10) RETURNING id",
    )]
    results = await asyncio.gather(*(client.requeue(i) for i in ids))
    assert sum(r.requeued for r in results) == 1
    (winner,) = [r.job_id for r in results if r.requeued]
    assert {r.conflict_job_id for r in results if not r.requeued} == {winner}
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'pending'")[0][0] == 1
