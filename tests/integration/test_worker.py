"""The worker runtime against a real PostgreSQL, in-process (one event loop, real connections)."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import psycopg
import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel
from testkit import running_worker, wait_for

from taskq import JobContext, JobFailed, JobsClient, NonRetryableError, RetryPolicy
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend import JobRow
from taskq.models import JobStatus

pytestmark = pytest.mark.timeout(60)


def stale_writes() -> float:
    return REGISTRY.get_sample_value("taskq_stale_writes_total") or 0.0


async def fetch_all(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


class Pair(BaseModel):
    a: int
    b: int


async def test_async_actor_result_is_stored_with_attempt_and_events(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="add", registry=reg)
    async def add(payload: Pair, ctx: JobContext[Pair]) -> int:
        return payload.a + payload.b

    async with running_worker(dsn, reg):
        handle = await client.enqueue(add, Pair(a=2, b=3))
        row = await handle.wait(timeout=10)
    assert row.status is JobStatus.SUCCEEDED and row.result == 5 and handle.result() == 5
    assert row.attempt == 1 and row.claim_epoch == 1 and row.lock_expires_at is None
    events = await client.events(handle.job_id)
    assert [(e.from_status, e.to_status) for e in events] == [
        ("pending", "running"),
        ("running", "succeeded"),
    ]
    attempts = await client.attempts(handle.job_id)
    assert [(a.attempt, a.outcome) for a in attempts] == [(1, "succeeded")]


async def test_failing_actor_retries_with_backoff_until_failed_and_runs_on_retry_exhausted(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    exhausted: list[JobRow] = []

    async def on_exhausted(row: JobRow) -> None:
        exhausted.append(row)

    @actor(
        name="flaky",
        registry=reg,
        max_attempts=3,
        retry=RetryPolicy(base=0.2, factor=2, jitter=0),
        on_retry_exhausted=on_exhausted,
    )
    async def flaky(payload: int, ctx: JobContext[int]) -> int:
        raise ValueError(f"bad luck on attempt {ctx.attempt}")

    async with running_worker(dsn, reg):
        handle = await client.enqueue(flaky, 1)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=15)
        await wait_for(lambda: exhausted, timeout=5)
    row = failed.value.row
    assert row.status is JobStatus.FAILED and row.attempt == 3
    assert row.error_class == "ValueError" and row.error_message == "bad luck on attempt 3"
    assert exhausted[0].id == row.id and exhausted[0].status is JobStatus.FAILED
    attempts = await client.attempts(handle.job_id)
    assert [a.outcome for a in attempts] == ["retried", "retried", "failed"]
    gaps = [(attempts[i + 1].started_at - attempts[i].finished_at).total_seconds() for i in range(2)]  # type: ignore[operator]
    assert gaps[0] >= 0.19 and gaps[1] >= 0.39, gaps


async def test_non_retryable_error_fails_at_once(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="hopeless", registry=reg, max_attempts=5)
    async def hopeless(payload: int, ctx: JobContext[int]) -> int:
        raise NonRetryableError("no point trying again")

    async with running_worker(dsn, reg):
        handle = await client.enqueue(hopeless, 1)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    assert failed.value.row.attempt == 1 and failed.value.row.error_class == "NonRetryableError"


async def test_schedule_to_close_ends_a_running_job_with_deadline_exceeded(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()

    @actor(name="forever", registry=reg)
    async def forever(payload: int, ctx: JobContext[int]) -> int:
        await asyncio.sleep(60)
        return 0

    async with running_worker(dsn, reg):
        handle = await client.enqueue(forever, 1, schedule_to_close=0.5)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    assert failed.value.row.status is JobStatus.FAILED
    assert failed.value.row.error_class == "DeadlineExceeded"


async def test_attempt_timeout_forces_the_attempt_and_counts_as_a_failure(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()

    @actor(name="slowpoke", registry=reg, timeout=0.2, max_attempts=2, retry=RetryPolicy(base=0.05, jitter=0))
    async def slowpoke(payload: int, ctx: JobContext[int]) -> int:
        await asyncio.sleep(60)
        return 0

    async with running_worker(dsn, reg):
        handle = await client.enqueue(slowpoke, 1)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    assert failed.value.row.error_class == "AttemptTimeout" and failed.value.row.attempt == 2
    assert [a.outcome for a in await client.attempts(handle.job_id)] == ["retried", "failed"]


async def test_progress_is_persisted_and_visible_to_the_next_attempt(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()
    seen: list[Any] = []

    @actor(name="checkpointing", registry=reg, retry=RetryPolicy(base=0.05, jitter=0))
    async def checkpointing(payload: int, ctx: JobContext[int]) -> int:
        seen.append(ctx.last_progress)
        if ctx.attempt == 1:
            await ctx.progress({"cursor": 41}, message="half way")
            raise RuntimeError("crash after checkpoint")
        return int(ctx.last_progress["cursor"]) + 1

    async with running_worker(dsn, reg):
        handle = await client.enqueue(checkpointing, 1)
        row = await handle.wait(timeout=10)
    assert row.result == 42 and seen == [None, {"cursor": 41}]
    assert row.progress == {"data": {"cursor": 41}, "message": "half way"}


@pytest.mark.parametrize(
    ("actor_name", "payload", "error_class"),
    [("nobody.knows.me", 1, "UnknownActor"), ("typed", {"a": "x"}, "PayloadInvalid")],
)
async def test_unroutable_jobs_fail_at_once_without_retry(
    dsn: str, client: JobsClient, actor_name: str, payload: Any, error_class: str
) -> None:
    reg = ActorRegistry()

    @actor(name="typed", registry=reg)
    async def typed(payload: Pair, ctx: JobContext[Pair]) -> int:
        return 0

    async with running_worker(dsn, reg):
        handle = await JobsClient(client.backend, registry=ActorRegistry()).enqueue(actor_name, payload)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    row = failed.value.row
    assert row.status is JobStatus.FAILED and row.error_class == error_class and row.attempt == 1
    assert "enqueue" in (row.error_message or "")


async def test_unserialisable_result_fails_with_result_invalid(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()

    @actor(name="weird", registry=reg)
    async def weird(payload: int, ctx: JobContext[int]) -> Any:
        return object()

    async with running_worker(dsn, reg):
        handle = await client.enqueue(weird, 1)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    assert failed.value.row.error_class == "ResultInvalid" and failed.value.row.attempt == 1


async def test_child_jobs_carry_parent_id_and_their_handles_have_no_client(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    child_ids: list[UUID] = []
    errors: list[str] = []

    @actor(name="child", registry=reg)
    async def child(payload: int, ctx: JobContext[int]) -> int:
        return payload * 10

    @actor(name="parent", registry=reg)
    async def parent(payload: int, ctx: JobContext[int]) -> int:
        handle = await ctx.jobs.enqueue(child, payload + 1)
        child_ids.append(handle.job_id)
        try:
            await handle.cancel()
        except RuntimeError as exc:
            errors.append(str(exc))
        return payload

    async with running_worker(dsn, reg):
        handle = await client.enqueue(parent, 4)
        await handle.wait(timeout=10)
        kid = await client.get(child_ids[0])
        assert kid is not None
        kid_row = await kid.wait(timeout=10)
    assert kid_row.parent_id == handle.job_id and kid_row.result == 50
    assert errors and "no JobsClient" in errors[0]


async def test_fenced_out_write_changes_nothing_and_is_counted(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()
    release = asyncio.Event()
    started = asyncio.Event()

    @actor(name="zombie", registry=reg)
    async def zombie(payload: int, ctx: JobContext[int]) -> str:
        started.set()
        await release.wait()
        return "late"

    before = stale_writes()
    # a long heartbeat so that the tick does not notice the stolen row before the actor returns
    async with running_worker(dsn, reg, heartbeat_interval=5.0, lock_timeout=30.0, sweep_interval=30.0):
        handle = await client.enqueue(zombie, 1)
        await asyncio.wait_for(started.wait(), 10)
        # another attempt takes the row over behind this worker's back, then finishes it
        await fetch_all(
            dsn,
            "UPDATE taskq.jobs SET attempt = attempt + 1, claim_epoch = claim_epoch + 1, "
            "status = 'succeeded', finished_at = now(), result = '\"real\"' WHERE id = %s",
            handle.job_id,
        )
        release.set()
        await wait_for(lambda: stale_writes() > before, timeout=10)
    row = await handle.refresh()
    assert row.status is JobStatus.SUCCEEDED and row.result == "real" and row.attempt == 2
    assert stale_writes() == before + 1


async def test_heartbeat_stops_a_local_actor_whose_lease_was_lost_without_writing(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    cancelled = asyncio.Event()
    started = asyncio.Event()

    @actor(name="victim", registry=reg)
    async def victim(payload: int, ctx: JobContext[int]) -> int:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 0

    async with running_worker(dsn, reg):
        handle = await client.enqueue(victim, 1)
        await asyncio.wait_for(started.wait(), 10)
        await fetch_all(
            dsn,
            "UPDATE taskq.jobs SET claim_epoch = claim_epoch + 1, worker_id = 'someone-else' WHERE id = %s",
            handle.job_id,
        )
        await asyncio.wait_for(cancelled.wait(), 5)
        await asyncio.sleep(0)  # let the consumer unwind
    row = await handle.refresh()
    assert row.status is JobStatus.RUNNING and row.worker_id == "someone-else"
    assert [e.to_status for e in await client.events(handle.job_id)] == ["running"]


async def test_operator_cancel_reaches_a_running_actor_cooperatively(dsn: str, client: JobsClient) -> None:
    reg = ActorRegistry()
    started = asyncio.Event()

    @actor(name="polite", registry=reg)
    async def polite(payload: int, ctx: JobContext[int]) -> int:
        started.set()
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    async with running_worker(dsn, reg, heartbeat_interval=5.0, lock_timeout=30.0):
        handle = await client.enqueue(polite, 1)
        await asyncio.wait_for(started.wait(), 10)
        result = await client.cancel(handle.job_id, reason="stop it")
        assert result.cancellation_initiated
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=5)
    row = failed.value.row
    assert row.status is JobStatus.CANCELLED and row.error_class == "CancelledCooperatively"
    assert [a.error_class for a in await client.attempts(handle.job_id)] == ["CancelledCooperatively"]


async def test_sweeper_reclaims_expired_leases_with_the_right_verdicts(dsn: str, client: JobsClient) -> None:
    retry = await client.enqueue("gone.actor", 1, max_attempts=3)
    last = await client.enqueue("gone.actor", 2, max_attempts=1)
    with_cancel = await client.enqueue("gone.actor", 3, max_attempts=3)
    for h in (retry, last, with_cancel):
        await fetch_all(
            dsn,
            "UPDATE taskq.jobs SET status='running', attempt=attempt+1, claim_epoch=claim_epoch+1, "
            "worker_id='dead-worker', started_at=now(), lock_expires_at=now() - interval '1 s' "
            "WHERE id = %s",
            h.job_id,
        )
        await fetch_all(
            dsn,
            "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
            "VALUES (%s, 1, 1, 'dead-worker')",
            h.job_id,
        )
    await fetch_all(
        dsn,
        "UPDATE taskq.jobs SET cancel_phase = 1, cancel_requested_at = now() WHERE id = %s",
        with_cancel.job_id,
    )
    reg = ActorRegistry()
    async with running_worker(dsn, reg, queues=["elsewhere"]) as worker:
        swept = await worker.parts.sweeper.sweep_once()
    assert swept == {"scheduled": 1, "crashed": 1, "cancelled": 1}
    r1, r2, r3 = [await h.refresh() for h in (retry, last, with_cancel)]
    assert r1.status is JobStatus.SCHEDULED and r1.attempt == 1 and r1.worker_id is None
    assert r2.status is JobStatus.CRASHED and r2.error_class == "WorkerCrashed"
    assert r3.status is JobStatus.CANCELLED and r3.error_class is None
    for h in (retry, last, with_cancel):
        (attempt,) = await client.attempts(h.job_id)
        assert attempt.outcome == "crashed" and attempt.error_class == "WorkerCrashed"
        assert "lock_expired" in (attempt.error_message or "")
        assert (await client.events(h.job_id))[-1].detail["cause"] == "lock_expired"


async def test_shutdown_releases_a_running_job_without_refunding_the_attempt(
    dsn: str, client: JobsClient
) -> None:
    reg = ActorRegistry()
    started = asyncio.Event()

    @actor(name="stubborn", registry=reg)
    async def stubborn(payload: int, ctx: JobContext[int]) -> int:
        started.set()
        await asyncio.sleep(60)
        return 0

    async with running_worker(dsn, reg) as worker:
        handle = await client.enqueue(stubborn, 1)
        await asyncio.wait_for(started.wait(), 10)
    row = await handle.refresh()
    assert row.status is JobStatus.PENDING and row.attempt == 1 and row.interrupt_count == 1
    assert row.worker_id is None and row.cancel_requested_at is None
    assert worker.state.summary["released"] == [str(handle.job_id)]
    assert [a.outcome for a in await client.attempts(handle.job_id)] == ["interrupted"]
