"""Bad and awkward input to JobsClient: rejected before anything is written, or stored verbatim."""

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
from pydantic import BaseModel, ValidationError

from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend.migrations import migrate_dsn
from taskq.client import DEFAULT_MAX_PAYLOAD_BYTES, JobsClient
from taskq.exceptions import ConfigurationError, DatabaseUnavailable, PayloadInvalid, PayloadTooLarge
from taskq.models import JobFilter, JobStatus

registry = ActorRegistry()


class Order(BaseModel):
    order_id: int
    customer: str


@actor(name="tests.bad_input.ship", registry=registry)
async def ship(payload: Order) -> None:
    return None


@actor(name="tests.bad_input.echo", registry=registry)
async def echo(payload: str) -> str:
    return payload


@pytest.fixture(params=FACES)
async def jobs(dsn: str, request: pytest.FixtureRequest) -> AsyncIterator[JobsClient]:
    """The async client, and the sync one seen through tests/faces.py: every case runs on both faces."""
    async with client_of(request.param, dsn, registry=registry) as c:
        yield c


@pytest.fixture
async def raw(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


async def _job_count(conn: AsyncConnection[Any]) -> int:
    cur = await conn.execute("SELECT count(*) FROM taskq.jobs")
    row = await cur.fetchone()
    assert row is not None
    return int(row[0])


AWKWARD_TEXT = [
    "it's",
    'say "hi"',
    "back\\slash",
    "trailing\\",
    "a,b",
    "{braces}",
    "}{",
    "NULL",
    " padded ",
    "'; DROP TABLE taskq.jobs; --",
    "%(tags)s",
    "$1",
    "ünï ✓ 😀",
]


# -- payloads ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"order_id": "seven", "customer": "c"}, "order_id"),
        ({"order_id": 7}, "customer"),
        ({"order_id": 7, "customer": ["not", "text"]}, "customer"),
    ],
    ids=["wrong-type", "missing-field", "list-for-str"],
)
async def test_invalid_payload_is_rejected_naming_the_field_and_nothing_is_written(
    jobs: JobsClient, raw: AsyncConnection[Any], payload: dict[str, Any], field: str
) -> None:
    with pytest.raises(PayloadInvalid, match=field) as caught:
        await jobs.enqueue(ship, payload)
    assert "tests.bad_input.ship" in str(caught.value)
    with pytest.raises(PayloadInvalid, match=field):
        await jobs.enqueue("tests.bad_input.ship", payload)
    assert await _job_count(raw) == 0


async def test_unknown_actor_name_is_accepted_as_given(jobs: JobsClient) -> None:
    handle = await jobs.enqueue("somewhere.else.not_registered", {"order_id": "not checked"})
    assert handle.row is not None and handle.row.status is JobStatus.PENDING


@pytest.mark.parametrize(
    ("target", "payload", "message"),
    [
        ("unknown.actor", object(), "cannot be encoded as JSON"),
        ("unknown.actor", {"k": len}, "cannot be encoded as JSON"),
        ("unknown.actor", [b"\xff"], "cannot be encoded as JSON"),
        ("unknown.actor", "a\x00b", "NUL"),
        ("unknown.actor", {"nested": ["x\x00"]}, "NUL"),
        ("unknown.actor", {"key\x00": 1}, "NUL"),
        ("unknown.actor", "\\\x00", "NUL"),
        ("tests.bad_input.echo", "a\x00b", "NUL"),
        ("unknown.actor", "\ud800", "surrogate"),
        ("unknown.actor", {"k": "lone \udfff low"}, "surrogate"),
        ("tests.bad_input.echo", "\ud800", "surrogate"),
    ],
    ids=[
        "object",
        "function",
        "invalid-utf8-bytes",
        "nul-string",
        "nul-nested",
        "nul-key",
        "nul-after-backslash",
        "nul-known-actor",
        "lone-high-surrogate",
        "lone-low-surrogate",
        "surrogate-known-actor",
    ],
)
async def test_payload_that_postgres_cannot_store_as_json_is_rejected_clearly(
    jobs: JobsClient, raw: AsyncConnection[Any], target: str, payload: Any, message: str
) -> None:
    with pytest.raises(PayloadInvalid, match=message):
        await jobs.enqueue(target, payload)
    with pytest.raises(PayloadInvalid, match=message):
        await jobs.enqueue_many(target, ["fine", payload])
    assert await _job_count(raw) == 0


@pytest.mark.parametrize(
    "text",
    ["\\u0000", "\\\\u0000", "C:\\u0000dir\\", "\\u0000\x01"],
    ids=["backslash-u0000", "two-backslashes-u0000", "embedded", "followed-by-control-char"],
)
async def test_text_that_merely_looks_like_an_escaped_nul_is_stored_verbatim(jobs: JobsClient, text: str) -> None:
    handle = await jobs.enqueue("unknown.actor", {"text": text})
    fetched = await jobs.get(handle.job_id)
    assert fetched is not None and fetched.row is not None
    assert fetched.row.payload == {"text": text}


async def test_payload_over_the_default_limit_is_too_large_and_nothing_is_written(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    assert jobs.max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 1024 * 1024
    just_fits = "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 2)  # plus two quotes
    await jobs.enqueue("unknown.actor", just_fits)
    with pytest.raises(PayloadTooLarge, match="over the limit"):
        await jobs.enqueue("unknown.actor", just_fits + "x")
    with pytest.raises(PayloadTooLarge):
        await jobs.enqueue_many("unknown.actor", ["small", just_fits + "x"])
    assert await _job_count(raw) == 1


async def test_client_with_a_small_payload_limit_rejects_larger_payloads(dsn: str, raw: AsyncConnection[Any]) -> None:
    async with await JobsClient.connect(dsn, registry=registry, max_payload_bytes=64) as small:
        await small.enqueue(ship, {"order_id": 1, "customer": "c"})
        with pytest.raises(PayloadTooLarge, match="64"):
            await small.enqueue(ship, {"order_id": 1, "customer": "c" * 64})
        with pytest.raises(PayloadTooLarge):
            await small.enqueue("unknown.actor", ["y" * 70])
        with pytest.raises(PayloadTooLarge, match="64"):
            await small.enqueue_many(ship, [{"order_id": 1, "customer": "c"}, {"order_id": 2, "customer": "c" * 64}])
    assert await _job_count(raw) == 1


@pytest.mark.parametrize("limit", [0, -1, True, 1.5])
async def test_client_refuses_a_nonsense_payload_limit(dsn: str, limit: Any) -> None:
    client = await JobsClient.connect(dsn)
    try:
        with pytest.raises(ConfigurationError, match="max_payload_bytes"):
            JobsClient(client.backend, max_payload_bytes=limit)
    finally:
        await client.close()


# -- enqueue options -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"scheduled_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"scheduled_at": "tomorrow"}, "scheduled_at"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": True}, "max_attempts"),
        ({"priority": 2**40}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"schedule_to_close": math.nan}, "schedule_to_close"),
        ({"schedule_to_close": math.inf}, "schedule_to_close"),
        ({"schedule_to_close": -1.0}, "schedule_to_close"),
        ({"schedule_to_close": timedelta(0)}, "schedule_to_close"),
        ({"queue": ""}, "queue"),
        ({"queue": "q" * 256}, "queue"),
        ({"tags": "tenant-a"}, "tags"),
        ({"tags": ("",)}, "tag"),
        ({"tags": ("nul\x00",)}, "tag"),
        ({"unique_key": ""}, "unique_key must be 1-255 characters"),
        ({"unique_key": "k" * 256}, "unique_key must be 1-255 characters"),
        ({"unique_key": "half a pair \udc80"}, "valid Unicode"),
        ({"unique_key": b"bytes-key"}, "not bytes"),
        ({"unique_key": 42}, "unique_key must be a string"),
        ({"unique_key": "k", "unique_scope": "forever"}, "unique_scope must be 'active' or 'retained'"),
        ({"unique_scope": "retained"}, "needs a unique_key"),
        ({"depends_on": [UUID(int=1)]}, "do not exist"),
        ({"depends_on": [UUID(int=1)], "dependency_mode": "sometimes"}, "dependency_mode must be one of"),
        ({"dependency_mode": None}, "dependency_mode must be one of"),
        ({"depends_on": [UUID(int=i) for i in range(10_001)]}, "the limit"),
        ({"depends_on": str(UUID(int=1))}, "not a single job"),
        ({"depends_on": ["not-a-job"]}, "not a job id"),
        ({"depends_on": [UUID(int=1)], "unique_key": "k"}, "unique_key cannot be combined"),
    ],
    ids=[
        "naive-scheduled-at",
        "string-scheduled-at",
        "zero-attempts",
        "bool-attempts",
        "priority-over-32-bit",
        "float-priority",
        "nan-deadline",
        "infinite-deadline",
        "negative-deadline",
        "zero-deadline",
        "empty-queue",
        "long-queue",
        "tags-as-one-string",
        "empty-tag",
        "nul-in-tag",
        "empty-unique-key",
        "long-unique-key",
        "surrogate-unique-key",
        "bytes-unique-key",
        "int-unique-key",
        "unknown-unique-scope",
        "retained-without-key",
        "depends-on-missing-job",
        "unknown-dependency-mode",
        "no-dependency-mode",
        "too-many-parents",
        "depends-on-one-id-not-a-list",
        "depends-on-not-a-job",
        "depends-on-with-unique-key",
    ],
)
async def test_invalid_enqueue_options_are_configuration_errors_and_nothing_is_written(
    jobs: JobsClient, raw: AsyncConnection[Any], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        await jobs.enqueue("unknown.actor", {}, **options)
    with pytest.raises(ConfigurationError, match=message):
        await jobs.enqueue_many("unknown.actor", [{}, {}], **options)
    assert await _job_count(raw) == 0


async def test_enqueue_many_needs_one_unique_key_per_payload(jobs: JobsClient, raw: AsyncConnection[Any]) -> None:
    with pytest.raises(ConfigurationError, match="2 keys for 3 payloads"):
        await jobs.enqueue_many("unknown.actor", [1, 2, 3], unique_key=["a", "b"])
    with pytest.raises(ConfigurationError, match="unique_key must be 1-255"):
        await jobs.enqueue_many("unknown.actor", [1, 2], unique_key=["a", ""])
    assert await _job_count(raw) == 0


@pytest.mark.parametrize("name", ["", "a" * 256, "nul\x00name"], ids=["empty", "too-long", "nul"])
async def test_invalid_actor_names_are_configuration_errors(jobs: JobsClient, name: str) -> None:
    with pytest.raises(ConfigurationError, match="actor name"):
        await jobs.enqueue(name, {})


async def test_enqueue_target_must_be_an_actor_or_a_name(jobs: JobsClient) -> None:
    with pytest.raises(ConfigurationError, match="actor"):
        await jobs.enqueue(42, {})  # type: ignore[arg-type]


# -- tags and reasons with awkward characters ----------------------------------------------------


async def test_awkward_tags_are_stored_and_filtered_verbatim_via_enqueue(jobs: JobsClient) -> None:
    handle = await jobs.enqueue("unknown.actor", {}, tags=AWKWARD_TEXT)
    assert handle.row is not None and handle.row.tags == tuple(AWKWARD_TEXT)
    for tag in AWKWARD_TEXT:
        assert [r.id for r in await jobs.list_jobs(JobFilter(tags=(tag,)))] == [handle.job_id], tag


async def test_awkward_tags_survive_the_array_literal_of_enqueue_many(jobs: JobsClient) -> None:
    handles = await jobs.enqueue_many("unknown.actor", [{}, {}], tags=AWKWARD_TEXT)
    for handle in handles:
        fetched = await jobs.get(handle.job_id)
        assert fetched is not None and fetched.row is not None
        assert fetched.row.tags == tuple(AWKWARD_TEXT)
    for tag in AWKWARD_TEXT:
        found = {r.id for r in await jobs.list_jobs(JobFilter(tags=(tag,)))}
        assert found == {h.job_id for h in handles}, tag


@pytest.mark.parametrize("tag", AWKWARD_TEXT)
async def test_cancel_where_matches_an_awkward_tag_exactly(jobs: JobsClient, tag: str) -> None:
    target = await jobs.enqueue("unknown.actor", {}, tags=(tag,))
    near_miss = await jobs.enqueue("unknown.actor", {}, tags=(tag + "x", tag.strip() + "_"))
    result = await jobs.cancel_where(JobFilter(tags=(tag,)), reason=tag)
    assert result.job_ids == (target.job_id,)
    row = (await jobs.get(target.job_id)).row  # type: ignore[union-attr]
    assert row is not None and row.cancel_reason == tag
    spared = (await jobs.get(near_miss.job_id)).row  # type: ignore[union-attr]
    assert spared is not None and spared.status is JobStatus.PENDING


@pytest.mark.parametrize("reason", [*AWKWARD_TEXT, "x" * 10_000], ids=[*AWKWARD_TEXT, "max-length"])
async def test_awkward_cancel_reasons_are_stored_verbatim(jobs: JobsClient, reason: str) -> None:
    handle = await jobs.enqueue("unknown.actor", {})
    await jobs.cancel(handle.job_id, reason=reason)
    row = (await jobs.get(handle.job_id)).row  # type: ignore[union-attr]
    assert row is not None and row.cancel_reason == reason
    assert (await jobs.events(handle.job_id))[0].detail["reason"] == reason


@pytest.mark.parametrize("reason", ["x" * 10_001, "nul\x00"], ids=["too-long", "nul"])
async def test_unstorable_cancel_reasons_are_refused_before_any_write(jobs: JobsClient, reason: str) -> None:
    handle = await jobs.enqueue("unknown.actor", {})
    with pytest.raises(ConfigurationError, match="reason"):
        await jobs.cancel(handle.job_id, reason=reason)
    with pytest.raises(ConfigurationError, match="reason"):
        await jobs.cancel_where(JobFilter(ids=(handle.job_id,)), reason=reason)
    row = (await jobs.get(handle.job_id)).row  # type: ignore[union-attr]
    assert row is not None and row.status is JobStatus.PENDING


# -- filters and ids -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"tags": ()},
        {"ids": ()},
        {"statuses": ()},
        {"tags": ("",)},
        {"created_before": datetime(2030, 1, 1)},
        {"created_after": datetime(2020, 1, 1)},
        {
            "created_after": datetime(2030, 1, 1, tzinfo=UTC),
            "created_before": datetime(2020, 1, 1, tzinfo=UTC),
        },
        {
            "created_after": datetime(2030, 1, 1, tzinfo=UTC),
            "created_before": datetime(2030, 1, 1, tzinfo=UTC),
        },
        {"statuses": ("paused",)},
        {"tenant": "acme"},
        {"ids": ("not-a-uuid",)},
    ],
    ids=[
        "empty-tags",
        "empty-ids",
        "empty-statuses",
        "empty-tag",
        "naive-created-before",
        "naive-created-after",
        "after-later-than-before",
        "after-equal-to-before",
        "invalid-status",
        "unknown-field",
        "bad-id",
    ],
)
def test_malformed_job_filters_are_validation_errors(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        JobFilter(**fields)


@pytest.mark.parametrize("job_id", ["not-a-uuid", "", "1234", "'; DROP TABLE taskq.jobs; --"])
async def test_cancel_and_get_with_a_non_uuid_string_raise_value_error(jobs: JobsClient, job_id: str) -> None:
    with pytest.raises(ValueError, match="UUID"):
        await jobs.cancel(job_id)
    with pytest.raises(ValueError, match="UUID"):
        await jobs.get(job_id)


async def test_cancel_where_needs_a_job_filter(jobs: JobsClient) -> None:
    with pytest.raises(ConfigurationError, match="JobFilter"):
        await jobs.cancel_where({"tags": ["a"]})  # type: ignore[arg-type]


async def test_list_jobs_rejects_an_invalid_limit(jobs: JobsClient) -> None:
    with pytest.raises(ConfigurationError, match="limit"):
        await jobs.list_jobs(limit=0)


# -- unreachable database ------------------------------------------------------------------------

SECRET = "s3cr3t-Pa55w0rd"


@pytest.mark.parametrize(
    "bad_dsn",
    [
        f"postgresql://taskq:{SECRET}@127.0.0.1:1/taskq",
        f"host=127.0.0.1 port=1 user=taskq password={SECRET} dbname=taskq",
        f"postgresql://taskq@127.0.0.1:1/taskq?password={SECRET}&connect_timeout=2",
        f"postgresql://taskq:{SECRET}@/taskq?host=/nonexistent-taskq-socket-dir",
    ],
    ids=["url-userinfo", "key-value", "url-query", "missing-socket"],
)
async def test_unreachable_database_is_reported_without_the_password(bad_dsn: str) -> None:
    with pytest.raises(DatabaseUnavailable) as caught:
        await JobsClient.connect(bad_dsn, timeout=2.0)
    message = str(caught.value)
    assert SECRET not in message and SECRET not in repr(caught.value)
    assert "cannot connect" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    with pytest.raises(DatabaseUnavailable) as from_migrate:
        await migrate_dsn(bad_dsn)
    assert SECRET not in str(from_migrate.value)


async def test_connect_to_a_missing_database_is_database_unavailable(dsn: str) -> None:
    missing = psycopg.conninfo.make_conninfo(dsn, dbname=f"taskq_missing_{uuid4().hex[:8]}", password=SECRET)
    with pytest.raises(DatabaseUnavailable, match="does not exist") as caught:
        await JobsClient.connect(missing)
    assert SECRET not in str(caught.value)


async def test_malformed_dsn_is_a_configuration_error_without_the_password() -> None:
    with pytest.raises(ConfigurationError) as caught:
        await JobsClient.connect(f"host=localhost password={SECRET} nonsense_option=1")
    assert SECRET not in str(caught.value)


# -- schedules --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "x" * 201, "nul\x00", "half a pair: \udc80", 7, None])
async def test_schedule_actions_refuse_a_malformed_name_before_any_write(
    jobs: JobsClient, raw: AsyncConnection[Any], name: Any
) -> None:
    for action in (jobs.pause_schedule, jobs.resume_schedule, jobs.trigger_schedule):
        with pytest.raises(ConfigurationError, match="schedule name"):
            await action(name)
    assert await _job_count(raw) == 0


async def test_schedule_actions_on_an_unknown_name_raise_schedule_not_found(
    jobs: JobsClient, raw: AsyncConnection[Any]
) -> None:
    from taskq.exceptions import ScheduleNotFound

    for action in (jobs.pause_schedule, jobs.resume_schedule, jobs.trigger_schedule):
        with pytest.raises(ScheduleNotFound, match="no schedule named 'nightly'"):
            await action("nightly")
    assert await _job_count(raw) == 0 and await jobs.list_schedules() == []


async def test_pause_refuses_an_overlong_operator_name(jobs: JobsClient) -> None:
    with pytest.raises(ConfigurationError, match="by must be"):
        await jobs.pause_schedule("nightly", by="x" * 256)
