"""JobsClient.cancel / cancel_where against a real database (spec §2, §5-§8)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from prometheus_client import REGISTRY
from psycopg import AsyncConnection

from taskq import sql
from taskq.backend import Backend
from taskq.backend.workers import WorkerStore
from taskq.client import JobHandle, JobsClient
from taskq.exceptions import ConfigurationError
from taskq.models import CancelMarker, JobEvent, JobFilter, JobRow, JobStatus

TERMINAL = ["succeeded", "failed", "cancelled", "crashed", "abandoned"]


@pytest.fixture
async def raw(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def cancel_listener(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("LISTEN taskq_cancel")
        yield conn


async def _make_running(conn: AsyncConnection[Any], ids: Sequence[UUID], worker_id: str = "w1") -> None:
    """What a claim leaves behind, written directly: the worker runtime is not under test here."""
    await conn.execute(
        "UPDATE taskq.jobs SET status = 'running', attempt = attempt + 1, claim_epoch = claim_epoch + 1,"
        " worker_id = %s, lock_expires_at = now() + interval '1 minute', started_at = now()"
        " WHERE id = ANY(%s)",
        [worker_id, list(ids)],
    )


async def _make_terminal(conn: AsyncConnection[Any], ids: Sequence[UUID], status: str) -> None:
    await conn.execute(
        "UPDATE taskq.jobs SET status = %s, finished_at = now(),"
        " cancel_requested_at = CASE WHEN %s = 'cancelled' THEN now() END WHERE id = ANY(%s)",
        [status, status, list(ids)],
    )


async def _enqueue_in(client: JobsClient, status: str, **options: Any) -> UUID:
    """A job in `status`, for any of the eight statuses."""
    if status == "scheduled":
        options.setdefault("scheduled_at", datetime(2999, 1, 1, tzinfo=UTC))
    handle = await client.enqueue("tests.cancel.job", {"n": 1}, **options)
    async with await psycopg.AsyncConnection.connect(client.backend.dsn, autocommit=True) as conn:
        if status == "running":
            await _make_running(conn, [handle.job_id])
        elif status in TERMINAL:
            await _make_terminal(conn, [handle.job_id], status)
    return handle.job_id


async def _row(client: JobsClient, job_id: UUID) -> JobRow:
    row = await client.backend.get(job_id)
    assert row is not None
    return row


def _requested_total() -> float:
    return REGISTRY.get_sample_value("taskq_cancellation_requested_total") or 0.0


async def _notifications(conn: AsyncConnection[Any], count: int) -> list[str]:
    received = [n.payload async for n in conn.notifies(timeout=5.0, stop_after=count)]
    assert len(received) == count, f"expected {count} notifications within 5 s, got {received}"
    return received


def _cancel_events(events: list[JobEvent]) -> list[JobEvent]:
    return [e for e in events if e.kind in ("state_change", "cancel_requested")]


# -- effect by prior status (spec §2 table) ------------------------------------------------------


@pytest.mark.parametrize("status", ["pending", "scheduled"])
async def test_cancel_before_start_ends_the_job_cancelled_with_its_marker_and_timeline(
    client: JobsClient, status: str
) -> None:
    job_id = await _enqueue_in(client, status)
    result = await client.cancel(job_id, reason="user requested")

    assert result.job_id == job_id
    assert (result.previous_status, result.new_status) == (status, JobStatus.CANCELLED)
    assert result.cancellation_initiated is True
    row = await _row(client, job_id)
    assert row.status is JobStatus.CANCELLED
    assert row.error_class == CancelMarker.BEFORE_START
    assert CancelMarker.BEFORE_START.value == "CancelledBeforeStart"
    assert row.finished_at is not None and row.cancel_requested_at is not None
    assert row.cancel_reason == "user requested"
    assert (row.attempt, row.claim_epoch, row.cancel_phase, row.worker_id) == (0, 0, 0, None)
    events = await client.events(job_id)
    assert [(e.kind, e.from_status, e.to_status) for e in events] == [("state_change", status, "cancelled")]
    assert events[0].detail["error_class"] == "CancelledBeforeStart"
    assert events[0].detail["reason"] == "user requested"


async def test_cancel_of_a_running_job_records_a_cooperative_request_and_notifies_its_worker(
    client: JobsClient, cancel_listener: AsyncConnection[Any]
) -> None:
    job_id = await _enqueue_in(client, "running")
    before = await _row(client, job_id)

    result = await client.cancel(job_id, reason="stop it")

    assert (result.previous_status, result.new_status) == (JobStatus.RUNNING, JobStatus.RUNNING)
    assert result.cancellation_initiated is True
    row = await _row(client, job_id)
    assert row.status is JobStatus.RUNNING
    assert row.cancel_phase == 1 and row.cancel_requested_at is not None
    assert row.cancel_reason == "stop it"
    assert (row.finished_at, row.error_class) == (None, None)
    assert (row.attempt, row.claim_epoch, row.worker_id) == (before.attempt, before.claim_epoch, "w1")
    events = _cancel_events(await client.events(job_id))
    assert [(e.kind, e.from_status, e.to_status, e.attempt, e.worker_id) for e in events] == [
        ("cancel_requested", "running", "running", 1, "w1")
    ]
    assert await _notifications(cancel_listener, 1) == [f"{job_id}:{row.attempt}:{row.claim_epoch}:w1"]


@pytest.mark.parametrize("status", TERMINAL)
async def test_cancel_of_a_terminal_job_changes_nothing(client: JobsClient, status: str) -> None:
    job_id = await _enqueue_in(client, status)
    before = await _row(client, job_id)
    events_before = await client.events(job_id)

    result = await client.cancel(job_id, reason="too late")

    assert (result.previous_status, result.new_status) == (status, status)
    assert result.cancellation_initiated is False
    assert await _row(client, job_id) == before
    assert await client.events(job_id) == events_before


async def test_second_cancel_of_a_cancelled_job_is_not_initiated(client: JobsClient) -> None:
    job_id = await _enqueue_in(client, "pending")
    assert (await client.cancel(job_id, reason="first")).cancellation_initiated is True
    first = await _row(client, job_id)
    again = await client.cancel(job_id, reason="second")
    assert (again.previous_status, again.new_status, again.cancellation_initiated) == (
        JobStatus.CANCELLED,
        JobStatus.CANCELLED,
        False,
    )
    assert await _row(client, job_id) == first
    assert len(await client.events(job_id)) == 1


async def test_second_cancel_of_a_running_job_keeps_the_first_request(client: JobsClient) -> None:
    job_id = await _enqueue_in(client, "running")
    await client.cancel(job_id, reason="first")
    first = await _row(client, job_id)
    again = await client.cancel(job_id, reason="second")
    assert again.cancellation_initiated is False
    assert await _row(client, job_id) == first
    assert first.cancel_reason == "first"


async def test_handle_cancel_delegates_to_the_client(client: JobsClient) -> None:
    handle = await client.enqueue("tests.cancel.job", None)
    result = await handle.cancel(reason="via handle")
    assert result.cancellation_initiated is True
    assert (await _row(client, handle.job_id)).cancel_reason == "via handle"


async def test_handle_without_a_client_cannot_cancel() -> None:
    handle: JobHandle[Any] = JobHandle(uuid4(), client=None)
    with pytest.raises(RuntimeError, match="no JobsClient"):
        await handle.cancel()


@pytest.mark.parametrize(
    "reason",
    [
        "'; DROP TABLE x; --",
        'he said "stop"; then left',
        "back\\slash, comma, {brace}, 'quote'",
        "%(reason)s %s $1 \\x00-ish",
        "multi\nline\ttab ünïcødé ✓",
        "",
    ],
    ids=["sql-injection", "double-quotes", "escapes", "placeholders", "whitespace-unicode", "empty"],
)
async def test_cancel_reason_is_stored_verbatim(client: JobsClient, raw: AsyncConnection[Any], reason: str) -> None:
    pending = await _enqueue_in(client, "pending")
    running = await _enqueue_in(client, "running")
    await client.cancel(pending, reason=reason)
    await client.cancel(running, reason=reason)
    for job_id in (pending, running):
        assert (await _row(client, job_id)).cancel_reason == reason
        assert _cancel_events(await client.events(job_id))[0].detail["reason"] == reason
    cur = await raw.execute("SELECT to_regclass('taskq.jobs') IS NOT NULL")
    assert await cur.fetchone() == (True,)


async def test_cancel_of_an_unknown_job_raises_key_error(client: JobsClient) -> None:
    missing = uuid4()
    with pytest.raises(KeyError) as caught:
        await client.cancel(missing)
    assert caught.value.args == (missing,)


@pytest.mark.parametrize("status", ["pending", "running", "succeeded", "unknown"])
async def test_every_cancel_call_counts_exactly_one_request(client: JobsClient, status: str) -> None:
    job_id = uuid4() if status == "unknown" else await _enqueue_in(client, status)
    before = _requested_total()
    if status == "unknown":
        with pytest.raises(KeyError):
            await client.cancel(job_id)
    else:
        await client.cancel(job_id)
    assert _requested_total() == before + 1


# -- cancel_where --------------------------------------------------------------------------------


async def test_cancel_where_cancels_matching_unfinished_jobs_in_bounded_batches(
    client: JobsClient, raw: AsyncConnection[Any], cancel_listener: AsyncConnection[Any]
) -> None:
    tagged = ("tenant-a",)
    pending = [h.job_id for h in await client.enqueue_many("tests.cancel.job", [{}] * 20, tags=tagged)]
    scheduled = [
        h.job_id
        for h in await client.enqueue_many(
            "tests.cancel.job", [{}] * 10, tags=tagged, scheduled_at=datetime(2999, 1, 1, tzinfo=UTC)
        )
    ]
    running = [h.job_id for h in await client.enqueue_many("tests.cancel.job", [{}] * 10, tags=tagged)]
    await _make_running(raw, running, worker_id="w-bulk")
    terminal: dict[str, list[UUID]] = {}
    for status in TERMINAL:
        terminal[status] = [h.job_id for h in await client.enqueue_many("tests.cancel.job", [{}] * 2, tags=tagged)]
        await _make_terminal(raw, terminal[status], status)
    other_tenant = [h.job_id for h in await client.enqueue_many("tests.cancel.job", [{}] * 5, tags=("tenant-b",))]
    untouched = [*(i for ids in terminal.values() for i in ids), *other_tenant]
    untouched_before = {i: await _row(client, i) for i in untouched}

    result = await client.cancel_where(JobFilter(tags=tagged, unfinished=True), reason="offboarded", batch_size=7)

    assert result.by_previous_status == {
        JobStatus.PENDING: 20,
        JobStatus.SCHEDULED: 10,
        JobStatus.RUNNING: 10,
    }
    assert (result.total, result.cancelled_before_start, result.running_requested) == (40, 30, 10)
    assert result.batches == 6, "40 rows in batches of at most 7"
    assert len(result.job_ids) == 40
    assert set(result.job_ids) == {*pending, *scheduled, *running}
    assert {i: await _row(client, i) for i in untouched} == untouched_before

    for job_id in [*pending, *scheduled]:
        row = await _row(client, job_id)
        assert (row.status, row.error_class, row.cancel_reason) == (
            "cancelled",
            "CancelledBeforeStart",
            "offboarded",
        )
        assert row.finished_at is not None and row.cancel_requested_at is not None
    for job_id in running:
        row = await _row(client, job_id)
        assert (row.status, row.cancel_phase, row.error_class, row.finished_at) == ("running", 1, None, None)
        assert row.cancel_requested_at is not None
    expected = set()
    for job_id in running:
        row = await _row(client, job_id)
        expected.add(f"{job_id}:{row.attempt}:{row.claim_epoch}:w-bulk")
    assert set(await _notifications(cancel_listener, 10)) == expected

    again = await client.cancel_where(JobFilter(tags=tagged, unfinished=True), batch_size=7)
    assert (again.total, again.batches, again.job_ids) == (0, 0, ())


async def test_cancel_where_leaves_the_same_markers_as_cancelling_one_job_at_a_time(
    client: JobsClient, raw: AsyncConnection[Any]
) -> None:
    def marks(row: JobRow) -> tuple[Any, ...]:
        return (
            row.status,
            row.error_class,
            row.cancel_phase,
            row.cancel_reason,
            row.finished_at is not None,
            row.cancel_requested_at is not None,
            row.attempt,
            row.claim_epoch,
        )

    def timeline(events: list[JobEvent]) -> list[tuple[Any, ...]]:
        return [
            (
                e.kind,
                e.from_status,
                e.to_status,
                e.attempt,
                e.worker_id,
                {k: v for k, v in e.detail.items() if k != "bulk"},
            )
            for e in events
        ]

    for status in ("pending", "scheduled", "running"):
        single = await _enqueue_in(client, status, tags=("single",))
        bulk = await _enqueue_in(client, status, tags=("bulk",))
        await client.cancel(single, reason="same")
        result = await client.cancel_where(JobFilter(tags=("bulk",)), reason="same")
        assert result.job_ids == (bulk,)
        assert marks(await _row(client, bulk)) == marks(await _row(client, single))
        assert timeline(await client.events(bulk)) == timeline(await client.events(single))
        await raw.execute("UPDATE taskq.jobs SET tags = '{}' WHERE tags && '{single,bulk}'")


async def test_cancel_where_with_an_empty_filter_is_refused(client: JobsClient) -> None:
    job_id = await _enqueue_in(client, "pending")
    with pytest.raises(ConfigurationError, match="empty filter"):
        await client.cancel_where(JobFilter())
    assert (await _row(client, job_id)).status is JobStatus.PENDING


@pytest.mark.parametrize("batch_size", [0, -1, True, 100_001])
async def test_cancel_where_rejects_an_invalid_batch_size(client: JobsClient, batch_size: Any) -> None:
    with pytest.raises(ConfigurationError, match="batch_size"):
        await client.cancel_where(JobFilter(unfinished=True), batch_size=batch_size)


async def test_cancel_where_by_ids_touches_only_those_jobs(client: JobsClient) -> None:
    chosen = [await _enqueue_in(client, "pending") for _ in range(3)]
    spared = await _enqueue_in(client, "pending")
    result = await client.cancel_where(JobFilter(ids=tuple(chosen)))
    assert sorted(result.job_ids) == sorted(chosen)
    assert (await _row(client, spared)).status is JobStatus.PENDING


# -- cancel racing a claim -----------------------------------------------------------------------


def _assert_one_consistent_winner(row: JobRow, claimed: bool) -> None:
    if claimed:
        assert (row.status, row.attempt, row.claim_epoch, row.cancel_phase) == ("running", 1, 1, 1)
        assert row.cancel_requested_at is not None and row.error_class is None and row.finished_at is None
    else:
        assert (row.status, row.attempt, row.claim_epoch, row.worker_id) == ("cancelled", 0, 0, None)
        assert row.error_class == "CancelledBeforeStart" and row.finished_at is not None


async def test_cancel_racing_the_worker_claim_leaves_exactly_one_consistent_winner(
    client: JobsClient, dsn: str
) -> None:
    worker_backend = await Backend.open(dsn, min_size=1, max_size=2)
    try:
        store = WorkerStore(worker_backend, "w-race")
        jobs = [(await client.enqueue("tests.cancel.job", {}, queue=f"race-{i}")).job_id for i in range(30)]
        for i, job_id in enumerate(jobs):
            claim, cancel = await asyncio.gather(store.claim([f"race-{i}"], 1, 60.0), client.cancel(job_id))
            assert cancel.cancellation_initiated is True
            claimed = [c.id for c in claim] == [job_id]
            _assert_one_consistent_winner(await _row(client, job_id), claimed)
    finally:
        await worker_backend.close()


async def _wait_until_blocked_on_a_lock(conn: AsyncConnection[Any], deadline: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline
    while loop.time() < until:
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if await cur.fetchone() == (1,):
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the cancel never waited on the claim's row lock")


async def test_cancel_waiting_on_an_uncommitted_claim_flags_the_running_job(
    client: JobsClient, dsn: str, raw: AsyncConnection[Any]
) -> None:
    """The cancel must re-read the row after the claim's lock is released, not act on the stale
    'pending' it may have seen first."""
    job_id = (await client.enqueue("tests.cancel.job", {}, queue="held")).job_id
    async with await psycopg.AsyncConnection.connect(dsn) as worker:
        cur = await worker.execute(
            sql.query("job_claim"),
            {"queues": ["held"], "limit": 1, "worker_id": "w-held", "lock_timeout": 60.0},
        )
        assert [r[0] for r in await cur.fetchall()] == [job_id]
        cancel = asyncio.create_task(client.cancel(job_id, reason="during claim"))
        await _wait_until_blocked_on_a_lock(raw)
        assert not cancel.done()
        await worker.commit()
        result = await asyncio.wait_for(cancel, timeout=5)
    assert result.cancellation_initiated is True
    assert result.new_status is JobStatus.RUNNING
    _assert_one_consistent_winner(await _row(client, job_id), claimed=True)
