"""JobsClient against a real database: enqueue (single, many, transactional), get, wait and NOTIFY."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from faces import FACES, client_of
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from pydantic import BaseModel, TypeAdapter

from taskq.actors.declaration import ActorRegistry, actor
from taskq.client import JobsClient
from taskq.exceptions import JobFailed, PayloadInvalid
from taskq.models import JobFilter, JobStatus

registry = ActorRegistry()


class Image(BaseModel):
    url: str
    width: int


class Thumb(BaseModel):
    url: str
    size: int


@actor(name="tests.client.resize", queue="images", queues=["images", "urgent"], max_attempts=4, priority=5,
       registry=registry)
async def resize(payload: Image) -> Thumb:
    return Thumb(url=payload.url, size=payload.width // 2)


@pytest.fixture(params=FACES)
async def jobs(dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[JobsClient]:
    """A client whose registry knows `resize` (the shared `client` fixture uses the default registry): the
    async one, and the sync one seen through tests/faces.py, so every case runs on both faces."""
    async with client_of(request.param, dsn, registry=registry) as c:
        yield c


@pytest.fixture
async def async_jobs(dsn: str) -> AsyncIterator[JobsClient]:
    """The async client only: for the cases that hand it an AsyncConnection (the sync face's own are in
    test_sync_client.py)."""
    async with await JobsClient.connect(dsn, registry=registry) as c:
        yield c


@pytest.fixture
async def raw(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


async def _count(conn: AsyncConnection[Any], where: str = "true", params: Any = None) -> int:
    cur = await conn.execute(f"SELECT count(*) FROM taskq.jobs WHERE {where}", params)
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


async def _set_status(conn: AsyncConnection[Any], job_id: UUID, status: str, **extra: Any) -> None:
    """Put a row into a status as a worker would have left it (the client never writes these)."""
    columns = {"status": status, "finished_at": datetime.now(UTC)} | extra
    if status == "cancelled":
        columns.setdefault("cancel_requested_at", datetime.now(UTC))
    assignments = ", ".join(f"{name} = %({name})s" for name in columns)
    await conn.execute(
        f"UPDATE taskq.jobs SET {assignments} WHERE id = %(id)s",
        columns | {"id": job_id},
    )


# -- enqueue -------------------------------------------------------------------------------------


async def test_enqueue_by_actor_validates_the_payload_and_writes_a_pending_row(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    handle = await jobs.enqueue(resize, {"url": "s3://a.png", "width": "640"})
    row = handle.row
    assert row is not None
    assert (row.actor, row.queue, row.status) == ("tests.client.resize", "images", JobStatus.PENDING)
    assert row.payload == {"url": "s3://a.png", "width": 640}, "the payload is stored as validated"
    assert (row.priority, row.max_attempts, row.attempt, row.claim_epoch) == (5, 4, 0, 0)
    assert row.finished_at is None and row.cancel_phase == 0 and row.error_class is None
    assert await _count(raw) == 1


async def test_enqueue_by_registered_name_validates_the_payload(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    handle = await jobs.enqueue("tests.client.resize", Image(url="u", width=10))
    assert handle.row is not None
    assert handle.row.payload == {"url": "u", "width": 10}
    assert handle.row.queue == "images", "the registered actor's options apply when enqueued by name"
    with pytest.raises(PayloadInvalid, match="width"):
        await jobs.enqueue("tests.client.resize", {"url": "u"})
    assert await _count(raw) == 1


async def test_enqueue_by_unknown_name_writes_the_payload_as_given(jobs: JobsClient) -> None:
    payload = {"anything": [1, "two", None], "width": "not checked"}
    handle = await jobs.enqueue("reports.not_imported_here", payload)
    assert handle.row is not None
    assert (handle.row.actor, handle.row.queue, handle.row.payload) == (
        "reports.not_imported_here",
        "default",
        payload,
    )
    assert handle.row.max_attempts == 3


async def test_enqueue_with_a_future_scheduled_at_writes_a_scheduled_row(jobs: JobsClient) -> None:
    when = datetime.now(UTC) + timedelta(hours=1)
    handle = await jobs.enqueue("x", None, scheduled_at=when)
    assert handle.row is not None
    assert handle.row.status is JobStatus.SCHEDULED
    assert handle.row.scheduled_at == when


async def test_enqueue_with_a_relative_delay_writes_a_scheduled_row(jobs: JobsClient) -> None:
    before = datetime.now(UTC)
    handle = await jobs.enqueue("x", None, scheduled_at=timedelta(minutes=5))
    assert handle.row is not None
    assert handle.row.status is JobStatus.SCHEDULED
    assert before + timedelta(minutes=5) <= handle.row.scheduled_at <= datetime.now(UTC) + timedelta(minutes=5)


async def test_enqueue_with_a_past_scheduled_at_is_due_now(jobs: JobsClient) -> None:
    handle = await jobs.enqueue("x", None, scheduled_at=datetime.now(UTC) - timedelta(days=1))
    assert handle.row is not None
    assert handle.row.status is JobStatus.PENDING
    assert handle.row.scheduled_at >= handle.row.created_at - timedelta(seconds=1)


async def test_enqueue_options_are_stored_on_the_row(jobs: JobsClient) -> None:
    handle = await jobs.enqueue(
        resize,
        {"url": "u", "width": 1},
        queue="urgent",
        priority=-3,
        tags=("tenant-a", "batch-7"),
        max_attempts=9,
        schedule_to_close=timedelta(minutes=10),
    )
    row = handle.row
    assert row is not None
    assert (row.queue, row.priority, row.tags, row.max_attempts) == ("urgent", -3, ("tenant-a", "batch-7"), 9)
    assert row.schedule_to_close is not None
    assert math.isclose((row.schedule_to_close - row.created_at).total_seconds(), 600, abs_tol=5)


@pytest.mark.parametrize("chunk_size", [5000, 100], ids=["one-statement", "three-statements"])
async def test_enqueue_many_writes_every_row_in_one_transaction(
    jobs: JobsClient, raw: AsyncConnection[Any], chunk_size: int
) -> None:
    payloads: list[Any] = [{"url": f"u{i}", "width": str(i)} for i in range(249)]  # "7" validates as 7
    payloads.append(Image(url="u249", width=249))
    handles = await jobs.enqueue_many(resize, payloads, tags=("bulk",), chunk_size=chunk_size)
    assert len(handles) == 250 and len({h.job_id for h in handles}) == 250
    assert await _count(raw, "actor = 'tests.client.resize' AND status = 'pending' AND tags = '{bulk}'") == 250
    cur = await raw.execute("SELECT count(DISTINCT created_at) FROM taskq.jobs")
    assert await cur.fetchone() == (1,), "now() is per transaction: one created_at means one transaction"
    cur = await raw.execute("SELECT id, payload FROM taskq.jobs")
    stored = {job_id: payload for job_id, payload in await cur.fetchall()}
    assert [stored[h.job_id] for h in handles] == [{"url": f"u{i}", "width": i} for i in range(250)]


async def test_enqueue_many_with_one_invalid_payload_writes_nothing(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    payloads: list[Any] = [{"url": f"u{i}", "width": i} for i in range(20)]
    payloads[13] = {"url": "bad", "width": "wide"}
    with pytest.raises(PayloadInvalid, match="width"):
        await jobs.enqueue_many(resize, payloads)
    assert await _count(raw) == 0


async def test_enqueue_many_accepts_any_iterable_of_payloads(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    handles = await jobs.enqueue_many(resize, ({"url": f"u{i}", "width": i} for i in range(5)))
    assert len(handles) == 5
    assert await _count(raw) == 5


async def test_enqueue_many_of_nothing_writes_nothing(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    assert await jobs.enqueue_many(resize, []) == []
    assert await _count(raw) == 0


async def test_enqueue_many_with_a_future_scheduled_at_writes_scheduled_rows(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    await jobs.enqueue_many("x", [1, 2, 3], scheduled_at=timedelta(hours=2))
    assert await _count(raw, "status = 'scheduled'") == 3


@pytest.mark.parametrize(
    ("payload", "options"),
    [
        ({"url": "u", "width": 1}, {}),
        (
            {"z": 1, "a": [1.5, -0.25, 1e15, 2**70], "ü": "✓ \\ \" '", "n": None, "t": True},
            {"tags": ("x", "y")},
        ),
        ([], {"scheduled_at": timedelta(hours=1), "schedule_to_close": 90.5, "priority": -(2**31)}),
        ("text", {"scheduled_at": datetime(2001, 1, 1, tzinfo=UTC), "queue": "q", "max_attempts": 1}),
    ],
    ids=["actor-payload", "awkward-json", "scheduled-with-deadline", "past-schedule"],
)
async def test_the_row_returned_by_enqueue_is_the_row_stored(
    jobs: JobsClient, payload: Any, options: dict[str, Any]
) -> None:
    target: Any = resize if options == {} else "tests.client.unregistered"
    handle = await jobs.enqueue(target, payload, **options)
    fetched = await jobs.get(handle.job_id)
    assert fetched is not None
    assert handle.row == fetched.row


async def test_the_row_of_an_enqueue_handle_is_the_row_as_written_until_refreshed(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    handle = await jobs.enqueue(resize, {"url": "u", "width": 1})
    await _set_status(raw, handle.job_id, "failed")
    as_written = handle.row
    assert as_written is not None and as_written.status is JobStatus.PENDING
    refreshed = await handle.refresh()
    assert refreshed.status is JobStatus.FAILED
    assert handle.row is refreshed
    assert "failed" in repr(handle)


# -- transactional enqueue -----------------------------------------------------------------------


@pytest.fixture
async def own_conn(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    """The application's own connection, not in autocommit mode: enqueue joins its transaction."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        yield conn


async def test_enqueue_in_an_open_transaction_is_invisible_to_others_until_commit(
    async_jobs: JobsClient, own_conn: AsyncConnection[Any], raw: AsyncConnection[Any]
) -> None:
    handle = await async_jobs.enqueue(resize, {"url": "u", "width": 1}, connection=own_conn)
    assert own_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert await async_jobs.get(handle.job_id) is None
    assert await _count(raw) == 0
    await own_conn.commit()
    fetched = await async_jobs.get(handle.job_id)
    assert fetched is not None and fetched.row is not None
    assert fetched.row.status is JobStatus.PENDING


async def test_enqueue_in_a_rolled_back_transaction_leaves_no_row(
    async_jobs: JobsClient, own_conn: AsyncConnection[Any], raw: AsyncConnection[Any]
) -> None:
    await own_conn.execute("SELECT 1")  # the application's own work, already in the transaction
    handle = await async_jobs.enqueue(resize, {"url": "u", "width": 1}, connection=own_conn)
    many = await async_jobs.enqueue_many("x", [1, 2], connection=own_conn)
    await own_conn.rollback()
    assert await async_jobs.get(handle.job_id) is None
    assert all([await async_jobs.get(h.job_id) is None for h in many])
    assert await _count(raw) == 0


async def test_enqueue_many_in_an_open_transaction_commits_with_it(
    async_jobs: JobsClient, own_conn: AsyncConnection[Any], raw: AsyncConnection[Any]
) -> None:
    async with own_conn.transaction():
        await async_jobs.enqueue_many("x", list(range(7)), connection=own_conn, chunk_size=3)
        assert await _count(raw) == 0
    assert await _count(raw) == 7


async def test_transactional_enqueue_works_on_a_connection_with_its_own_row_factory(
    async_jobs: JobsClient, dsn: str, raw: AsyncConnection[Any]
) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, row_factory=dict_row) as conn:
        handle = await async_jobs.enqueue(resize, {"url": "u", "width": 1}, connection=conn)
        await async_jobs.enqueue_many(resize, [{"url": "v", "width": 2}], connection=conn)
        await conn.commit()
    assert handle.row is not None and handle.row.status is JobStatus.PENDING
    assert await _count(raw) == 2


# -- get / wait ----------------------------------------------------------------------------------


async def test_get_returns_none_for_an_unknown_id(jobs: JobsClient) -> None:
    assert await jobs.get(uuid4()) is None
    assert await jobs.get(str(uuid4())) is None


async def test_get_returns_a_handle_with_the_current_row(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    handle = await jobs.enqueue(resize, {"url": "u", "width": 1})
    await _set_status(raw, handle.job_id, "succeeded", result='{"url": "t", "size": 3}')
    fetched = await jobs.get(str(handle.job_id))
    assert fetched is not None and fetched.row is not None
    assert fetched.job_id == handle.job_id
    assert fetched.row.status is JobStatus.SUCCEEDED
    assert fetched.result() == Thumb(url="t", size=3), "the actor's result type decodes the stored result"
    explicit = await jobs.get(handle.job_id, result_adapter=TypeAdapter(dict[str, Any]))
    assert explicit is not None
    assert explicit.result() == {"url": "t", "size": 3}


async def test_wait_on_a_pending_job_times_out(jobs: JobsClient) -> None:
    handle = await jobs.enqueue("x", None)
    with pytest.raises(TimeoutError, match="pending"):
        await handle.wait(timeout=0.2)
    assert handle.row is not None and handle.row.status is JobStatus.PENDING


async def test_wait_returns_the_row_of_a_succeeded_job(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    handle = await jobs.enqueue(resize, {"url": "u", "width": 8})
    await _set_status(raw, handle.job_id, "succeeded", result='{"url": "u", "size": 4}')
    row = await handle.wait(timeout=5)
    assert row.status is JobStatus.SUCCEEDED
    assert handle.result() == Thumb(url="u", size=4)


@pytest.mark.parametrize("status", ["failed", "cancelled", "crashed", "abandoned"])
async def test_wait_raises_job_failed_with_the_row_for_an_unsuccessful_job(
    jobs: JobsClient, raw: AsyncConnection[Any], status: str
) -> None:
    handle = await jobs.enqueue("x", None)
    await _set_status(raw, handle.job_id, status, error_class="Boom")
    with pytest.raises(JobFailed) as caught:
        await handle.wait(timeout=5)
    assert caught.value.row.id == handle.job_id
    assert caught.value.row.status == status
    assert "Boom" in str(caught.value)


async def test_refresh_reads_the_row_again(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    handle = await jobs.enqueue("x", None)
    await _set_status(raw, handle.job_id, "failed")
    assert (await handle.refresh()).status is JobStatus.FAILED
    assert handle.row is not None and handle.row.status is JobStatus.FAILED


async def test_list_jobs_returns_matching_rows_newest_first(jobs: JobsClient) -> None:
    first = await jobs.enqueue("x", 1, tags=("t",))
    second = await jobs.enqueue("x", 2, tags=("t",))
    await jobs.enqueue("x", 3, tags=("other",))
    rows = await jobs.list_jobs(JobFilter(tags=("t",)))
    assert [r.id for r in rows] == [second.job_id, first.job_id]


# -- NOTIFY --------------------------------------------------------------------------------------


@pytest.fixture
async def listener(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("LISTEN taskq_jobs")
        yield conn


async def _next_notifications(conn: AsyncConnection[Any], count: int) -> list[tuple[str, str]]:
    received = [(n.channel, n.payload) async for n in conn.notifies(timeout=5.0, stop_after=count)]
    assert len(received) == count, f"expected {count} notifications within 5 s, got {received}"
    return received


async def test_enqueue_notifies_the_queue_name_on_taskq_jobs(jobs: JobsClient, listener: AsyncConnection[Any]) -> None:
    await jobs.enqueue(resize, {"url": "u", "width": 1})
    assert await _next_notifications(listener, 1) == [("taskq_jobs", "images")]


async def test_scheduled_enqueue_does_not_notify(jobs: JobsClient, listener: AsyncConnection[Any]) -> None:
    await jobs.enqueue("x", None, queue="later", scheduled_at=timedelta(hours=1))
    await jobs.enqueue("x", None, queue="now")
    # notifications arrive in commit order: had the scheduled job notified, "later" would come first
    assert await _next_notifications(listener, 1) == [("taskq_jobs", "now")]


async def test_enqueue_many_notifies_once_per_queue(jobs: JobsClient, listener: AsyncConnection[Any]) -> None:
    await jobs.enqueue_many("x", list(range(50)), queue="bulk")
    await jobs.enqueue("x", None, queue="marker")
    assert await _next_notifications(listener, 2) == [("taskq_jobs", "bulk"), ("taskq_jobs", "marker")]


async def test_transactional_enqueue_notifies_only_at_commit(
    async_jobs: JobsClient, own_conn: AsyncConnection[Any], listener: AsyncConnection[Any]
) -> None:
    await async_jobs.enqueue("x", None, queue="in-tx", connection=own_conn)
    await async_jobs.enqueue("x", None, queue="outside")
    assert await _next_notifications(listener, 1) == [("taskq_jobs", "outside")]
    await own_conn.commit()
    assert await _next_notifications(listener, 1) == [("taskq_jobs", "in-tx")]
