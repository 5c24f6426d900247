"""JobsClient and JobHandle: enqueue, inspect, wait for and cancel jobs (spec §2, §5-§7)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, Self, TypeVar
from uuid import UUID

from psycopg import AsyncConnection
from pydantic import TypeAdapter

from taskq.actors.declaration import Actor, ActorRegistry, default_registry
from taskq.backend import Backend, JobInsert, uuid7
from taskq.dsn import resolve_dsn
from taskq.exceptions import ConfigurationError, JobFailed, PayloadInvalid, PayloadTooLarge
from taskq.metrics import CANCELLATION_REQUESTED
from taskq.models import (
    FAILURE_STATUSES,
    BulkCancelResult,
    CancelResult,
    JobAttempt,
    JobEvent,
    JobFilter,
    JobRow,
)

R = TypeVar("R")

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
WAIT_POLL_INTERVAL = 0.5
_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def as_job_id(job_id: UUID | str) -> UUID:
    if isinstance(job_id, UUID):
        return job_id
    try:
        return UUID(str(job_id))
    except ValueError:
        raise ValueError(f"not a job id (expected a UUID): {job_id!r}") from None


def _seconds(name: str, value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{name} must be a positive finite duration, got {value!r}")
    return float(seconds)


def _when(value: datetime | timedelta | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return datetime.now(UTC) + value
    if not isinstance(value, datetime):
        raise ConfigurationError(f"scheduled_at must be a datetime or timedelta, got {value!r}")
    if value.tzinfo is None:
        raise ConfigurationError("scheduled_at must be timezone-aware (e.g. datetime.now(UTC))")
    return value


def _check_text(name: str, value: str, *, max_len: int = 255) -> str:
    if not isinstance(value, str) or not value or len(value) > max_len or "\x00" in value:
        raise ConfigurationError(f"{name} must be 1-{max_len} characters without NUL, got {value!r}")
    return value


def check_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str) or len(reason) > 10_000 or "\x00" in reason:
        raise ConfigurationError("reason must be text of at most 10,000 characters without NUL")
    return reason


def encode_payload(actor: Actor[Any, Any] | None, name: str, payload: Any, max_bytes: int) -> str:
    """Validate (when the actor is known here) and encode the payload as JSON text, within the size limit."""
    if actor is not None:
        raw = actor.dump_payload(payload)
    else:
        try:
            raw = _ANY.dump_json(payload)
        except Exception as exc:
            raise PayloadInvalid(f"payload for actor {name!r} cannot be encoded as JSON: {exc}") from None
    if len(raw) > max_bytes:
        raise PayloadTooLarge(
            f"payload for actor {name!r} is {len(raw):,} bytes of JSON, over the limit of {max_bytes:,} "
            "(store large data elsewhere and enqueue a reference, or raise max_payload_bytes)"
        )
    if b"\\u0000" in raw:
        raise PayloadInvalid(f"payload for actor {name!r} contains a NUL character, which PostgreSQL cannot store")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadInvalid(f"payload for actor {name!r} is not valid UTF-8") from None


def prepare_insert(
    target: Actor[Any, Any] | str,
    payload: Any,
    *,
    registry: ActorRegistry,
    max_payload_bytes: int,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] = (),
    scheduled_at: datetime | timedelta | None = None,
    max_attempts: int | None = None,
    schedule_to_close: float | timedelta | None = None,
    parent_id: UUID | None = None,
) -> JobInsert:
    """Everything enqueue checks before any write: the payload, names, tags, times and limits."""
    if isinstance(target, Actor):
        actor: Actor[Any, Any] | None = target
        name = target.name
    elif isinstance(target, str):
        name = _check_text("actor name", target)
        actor = registry.get(name)
    else:
        raise ConfigurationError(f"enqueue needs an actor or an actor name, got {target!r}")
    if isinstance(tags, str):
        raise ConfigurationError("tags must be a sequence of strings, not one string")
    tag_tuple = tuple(_check_text("tag", t) for t in tags)
    attempts = max_attempts if max_attempts is not None else (actor.max_attempts if actor else 3)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ConfigurationError(f"max_attempts must be an int >= 1, got {attempts!r}")
    prio = priority if priority is not None else (actor.priority if actor else 0)
    if isinstance(prio, bool) or not isinstance(prio, int) or not -(2**31) <= prio < 2**31:
        raise ConfigurationError(f"priority must be a 32-bit int, got {prio!r}")
    deadline = schedule_to_close if schedule_to_close is not None else (actor.schedule_to_close if actor else None)
    return JobInsert(
        id=uuid7(),
        actor=name,
        queue=_check_text("queue", queue if queue is not None else (actor.queue if actor else "default")),
        payload_json=encode_payload(actor, name, payload, max_payload_bytes),
        priority=prio,
        tags=tag_tuple,
        max_attempts=attempts,
        scheduled_at=_when(scheduled_at),
        schedule_to_close=_seconds("schedule_to_close", deadline),
        parent_id=parent_id,
    )


class JobHandle(Generic[R]):
    """A job by id. `row` is the row as last read (None until read). Handles made inside an actor
    (`ctx.jobs.enqueue`) have no client: cancel() and wait() raise RuntimeError there."""

    def __init__(
        self,
        job_id: UUID,
        *,
        client: JobsClient | None,
        row: JobRow | None = None,
        result_adapter: TypeAdapter[R] | None = None,
    ) -> None:
        self.job_id = job_id
        self.row = row
        self._client = client
        self._result_adapter = result_adapter

    def __repr__(self) -> str:
        status = self.row.status if self.row else "?"
        return f"JobHandle({self.job_id}, {status})"

    def _require_client(self) -> JobsClient:
        if self._client is None:
            raise RuntimeError(
                "this JobHandle has no JobsClient (it was created inside an actor by ctx.jobs.enqueue); "
                "use JobsClient.get(job_id) to act on the job"
            )
        return self._client

    async def cancel(self, reason: str | None = None) -> CancelResult:
        return await self._require_client().cancel(self.job_id, reason=reason)

    async def refresh(self) -> JobRow:
        row = await self._require_client().backend.get(self.job_id)
        if row is None:
            raise KeyError(self.job_id)
        self.row = row
        return row

    async def wait(self, timeout: float | None = None) -> JobRow:
        """Poll every 0.5 s until the job is terminal. Returns the row if it succeeded; raises JobFailed
        (with `.row`) if it ended cancelled, failed, crashed or abandoned; TimeoutError after `timeout`."""
        client = self._require_client()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            row = await client.backend.get(self.job_id)
            if row is None:
                raise KeyError(self.job_id)
            self.row = row
            if row.status in FAILURE_STATUSES:
                raise JobFailed(row)
            if row.is_terminal:
                return row
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"job {self.job_id} still {row.status} after {timeout} s")
                await asyncio.sleep(min(WAIT_POLL_INTERVAL, remaining))
            else:
                await asyncio.sleep(WAIT_POLL_INTERVAL)

    def result(self) -> R:
        """The stored result decoded with the result adapter (the raw JSON value without one)."""
        if self.row is None:
            raise RuntimeError("no row read yet: await wait() or refresh() first")
        if self._result_adapter is None:
            return self.row.result  # type: ignore[no-any-return]
        return self._result_adapter.validate_python(self.row.result)


class JobsClient:
    """Enqueue, inspect and cancel jobs. `async with await JobsClient.connect(dsn) as client: ...`"""

    def __init__(
        self,
        backend: Backend,
        *,
        registry: ActorRegistry | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    ) -> None:
        if isinstance(max_payload_bytes, bool) or not isinstance(max_payload_bytes, int) or max_payload_bytes < 1:
            raise ConfigurationError(f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}")
        self.backend = backend
        self.registry = registry if registry is not None else default_registry
        self.max_payload_bytes = max_payload_bytes

    @classmethod
    async def connect(
        cls,
        dsn: str | None = None,
        *,
        registry: ActorRegistry | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        min_size: int = 1,
        max_size: int = 10,
        timeout: float = 10.0,
    ) -> Self:
        """Open a client. `dsn` None means `TASKQ_DSN`, else the embedded server. Raises
        DatabaseUnavailable, SchemaNotReady (run `taskq migrate`) or SchemaTooNew."""
        resolved = resolve_dsn(dsn)
        backend = await Backend.open(resolved, min_size=min_size, max_size=max_size, timeout=timeout)
        return cls(backend, registry=registry, max_payload_bytes=max_payload_bytes)

    async def close(self) -> None:
        await self.backend.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _prepare(self, target: Actor[Any, Any] | str, payload: Any, **options: Any) -> JobInsert:
        return prepare_insert(
            target, payload, registry=self.registry, max_payload_bytes=self.max_payload_bytes, **options
        )

    def _adapter(self, target: Actor[Any, Any] | str) -> TypeAdapter[Any] | None:
        actor = target if isinstance(target, Actor) else self.registry.get(target)
        return actor.result_adapter if actor else None

    async def enqueue(
        self,
        target: Actor[Any, R] | str,
        payload: Any,
        *,
        queue: str | None = None,
        priority: int | None = None,
        tags: Iterable[str] = (),
        scheduled_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        schedule_to_close: float | timedelta | None = None,
        connection: AsyncConnection[Any] | None = None,
    ) -> JobHandle[R]:
        """Validate then write one job. With `connection`, the insert joins that connection's open
        transaction (commit or roll back with your own data); otherwise it commits at once."""
        job = self._prepare(
            target, payload, queue=queue, priority=priority, tags=tags, scheduled_at=scheduled_at,
            max_attempts=max_attempts, schedule_to_close=schedule_to_close,
        )
        row = await self.backend.job_insert(job, conn=connection)
        return JobHandle(row.id, client=self, row=row, result_adapter=self._adapter(target))

    async def enqueue_many(
        self,
        target: Actor[Any, R] | str,
        payloads: Sequence[Any],
        *,
        queue: str | None = None,
        priority: int | None = None,
        tags: Iterable[str] = (),
        scheduled_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        schedule_to_close: float | timedelta | None = None,
        connection: AsyncConnection[Any] | None = None,
        chunk_size: int = 5000,
    ) -> list[JobHandle[R]]:
        """Validate every payload first, then write them all in one transaction (statements of at most
        `chunk_size` rows). One invalid payload writes nothing."""
        tag_tuple = tuple(tags)
        jobs = [
            self._prepare(
                target, p, queue=queue, priority=priority, tags=tag_tuple, scheduled_at=scheduled_at,
                max_attempts=max_attempts, schedule_to_close=schedule_to_close,
            )
            for p in payloads
        ]
        if jobs:
            chunks = [jobs[i : i + chunk_size] for i in range(0, len(jobs), chunk_size)]
            if connection is not None:
                for chunk in chunks:
                    await self.backend.job_insert_many(chunk, conn=connection)
            elif len(chunks) == 1:
                await self.backend.job_insert_many(chunks[0])
            else:
                async with self.backend.pool.connection() as conn, conn.transaction():
                    for chunk in chunks:
                        await self.backend.job_insert_many(chunk, conn=conn)
        adapter = self._adapter(target)
        return [JobHandle(j.id, client=self, result_adapter=adapter) for j in jobs]

    async def get(self, job_id: UUID | str, *, result_adapter: TypeAdapter[R] | None = None) -> JobHandle[R] | None:
        """The job's handle with `.row` freshly read, or None if no such job exists."""
        row = await self.backend.get(as_job_id(job_id))
        if row is None:
            return None
        adapter = result_adapter if result_adapter is not None else self._adapter(row.actor)
        return JobHandle(row.id, client=self, row=row, result_adapter=adapter)

    async def list_jobs(self, flt: JobFilter | None = None, *, limit: int = 100) -> list[JobRow]:
        """Matching jobs, newest first."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
            raise ConfigurationError(f"limit must be between 1 and 100000, got {limit!r}")
        return await self.backend.job_list(flt or JobFilter(), limit=limit)

    async def events(self, job_id: UUID | str) -> list[JobEvent]:
        return await self.backend.job_events(as_job_id(job_id))

    async def attempts(self, job_id: UUID | str) -> list[JobAttempt]:
        return await self.backend.job_attempts(as_job_id(job_id))

    async def cancel(self, job_id: UUID | str, reason: str | None = None) -> CancelResult:
        """Request cancellation (spec §2): pending/scheduled jobs end cancelled at once; a running job
        gets a cooperative request its worker acts on. KeyError if the job does not exist."""
        CANCELLATION_REQUESTED.inc()
        jid = as_job_id(job_id)
        reason = check_reason(reason)
        before = await self.backend.get(jid)
        if before is None:
            raise KeyError(jid)
        changed = await self.backend.write_cancel_request(jid, reason)
        after = await self.backend.get(jid)
        assert after is not None  # jobs rows are never deleted while a client reads them
        return CancelResult(
            job_id=jid,
            previous_status=before.status,
            new_status=after.status,
            cancellation_initiated=changed is not None,
        )

    async def cancel_where(
        self, flt: JobFilter, reason: str | None = None, *, batch_size: int = 1000
    ) -> BulkCancelResult:
        """Cancel every matching unfinished job, in committed batches of `batch_size`. An empty filter
        is refused: say `JobFilter(unfinished=True)` to mean every job."""
        if not isinstance(flt, JobFilter):
            raise ConfigurationError(f"cancel_where needs a JobFilter, got {flt!r}")
        if flt.is_empty:
            raise ConfigurationError("refusing to cancel with an empty filter; use JobFilter(unfinished=True) for all")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 1 <= batch_size <= 100_000:
            raise ConfigurationError(f"batch_size must be between 1 and 100000, got {batch_size!r}")
        return await self.backend.cancel_where(flt, check_reason(reason), batch_size=batch_size)
