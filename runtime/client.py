"""JobsClient and JobHandle: enqueue, inspect, wait for and cancel jobs (spec §2, §5-§7)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Generic, Self, cast
from uuid import UUID

from psycopg import AsyncConnection
from pydantic import TypeAdapter
from typing_extensions import TypeVar

from taskq import tracing, workflows
from taskq.actors.declaration import Actor, ActorRegistry, default_registry
from taskq.backend import Backend, JobBatch, JobInsert, transaction_pooler_from_env, uuid7, uuid7_many
from taskq.backend.durable import SignalRow, StepRow
from taskq.backend.queues import UNSET
from taskq.checks import as_job_id, as_workflow_id
from taskq.dsn import resolve_dsn
from taskq.enqueue import DEFAULT_MAX_PAYLOAD_BYTES as DEFAULT_MAX_PAYLOAD_BYTES
from taskq.enqueue import (
    batch_fairness_keys,
    check_options,
    encode_payloads,
    prepare_insert,
)
from taskq.exceptions import ConfigurationError, DependencyInvalid, JobFailed
from taskq.models import (
    FAILURE_STATUSES,
    BulkCancelResult,
    BulkRequeueResult,
    CancelResult,
    FairKeyStats,
    FairnessWeightResult,
    JobAttempt,
    JobEvent,
    JobFilter,
    JobRow,
    QueueLimitsResult,
    QueuePauseResult,
    QueueStatsReport,
    RequeueResult,
    ScheduleInfo,
    SchedulePauseResult,
    ScheduleTriggerResult,
    WorkflowCancelResult,
)
from taskq.ops import durable as durable_ops
from taskq.ops import jobs as job_ops
from taskq.ops import queues as queue_ops
from taskq.ops import schedules as schedule_ops
from taskq.unique import batch_unique_keys

# The result type of a handle; Any when it cannot be known (a job enqueued by name). Without the
# default, mypy --strict rejects `handle = await client.enqueue("name", ...)` (cannot infer R).
R = TypeVar("R", default=Any)

WAIT_POLL_INTERVAL = 0.5


def offset_skipped(start: int, skipped: dict[int, UUID] | None) -> dict[int, UUID]:
    return {start + i: holder for i, holder in (skipped or {}).items()}


class JobHandle(Generic[R]):
    """A job by id. `row` is the row as last read (None until read). Handles made inside an actor
    (`ctx.jobs.enqueue`) have no client: cancel() and wait() raise RuntimeError there.

    `created` is True when the call that returned the handle wrote the job, False when a unique
    enqueue found its key held and returned the holder instead (and for `JobsClient.get`)."""

    def __init__(
        self,
        job_id: UUID,
        *,
        client: JobsClient | None,
        row: JobRow | None = None,
        result_adapter: TypeAdapter[R] | None = None,
        row_loader: Callable[[], JobRow] | None = None,
        created: bool = True,
    ) -> None:
        self.job_id = job_id
        self.created = created
        self._row = row
        # enqueue knows the whole row it wrote, but building the model costs as much Python as the
        # insert itself, and most producers never look at it: build it on first access
        self._row_loader = row_loader if row is None else None
        self._client = client
        self._result_adapter = result_adapter

    @property
    def row(self) -> JobRow | None:
        if self._row is None and self._row_loader is not None:
            self._row = self._row_loader()
            self._row_loader = None
        return self._row

    @row.setter
    def row(self, value: JobRow | None) -> None:
        self._row = value
        self._row_loader = None

    def __repr__(self) -> str:
        status = self.row.status if self.row else "?"
        return f"JobHandle({self.job_id}, {status}{'' if self.created else ', created=False'})"

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
        deadline = None if timeout is None else time.monotonic() + timeout
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
                remaining = deadline - time.monotonic()
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
            return cast(R, self.row.result)
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
        transaction_pooler: bool | None = None,
    ) -> Self:
        """Open a client. `dsn` None means `TASKQ_DSN`, else the embedded server. `transaction_pooler`:
        `dsn` goes through PgBouncer in transaction mode or the like, so no prepared statements (None reads
        env `TASKQ_TRANSACTION_POOLER`). Raises DatabaseUnavailable, SchemaNotReady (run `taskq migrate`)
        or SchemaTooNew."""
        resolved = resolve_dsn(dsn)
        pooled = transaction_pooler_from_env() if transaction_pooler is None else transaction_pooler
        backend = await Backend.open(resolved, min_size=min_size, max_size=max_size, timeout=timeout,
                                     transaction_pooler=pooled)
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
        unique_key: str | bool | None = None,
        unique_scope: str = "active",
        depends_on: Iterable[workflows.ParentRef] | None = None,
        dependency_mode: str = "on_success",
        concurrency_key: str | None = None,
        fairness_key: str | None = None,
        workflow_id: UUID | str | None = None,
    ) -> JobHandle[R]:
        """Validate then write one job. With `connection`, the insert joins that connection's open
        transaction (commit or roll back with your own data); otherwise it commits at once.

        `unique_key` (a string, or True to derive it from the actor, queue and payload): when another job
        holds the key, nothing is written and the handle is that job's, with `created` False. Scope
        'active' (default) holds the key while the job is pending, scheduled or running; 'retained'
        for as long as its row is kept, whatever its status.

        `depends_on` (handles or ids of existing jobs, at most workflows.MAX_PARENTS): the job waits in
        awaiting_parents until they are terminal (docs/workflows.md). `dependency_mode` 'on_success' cancels
        it (ParentFailed) when a parent ends other than succeeded; 'on_any_terminal' runs it anyway.

        `concurrency_key` (e.g. a tenant): the key of the per-key limits (`concurrency_per_key`) of the
        job's queue and actor.

        `fairness_key` (e.g. a tenant, at most 200 characters): the job's queue shares its starts among the
        keys with jobs ready, by their weights (`set_fairness_weight`, default 1); None is the empty key
        (docs/fairness.md).

        `workflow_id` (a `Workflow.id`): the job joins that workflow (`cancel_workflow` cancels it with the
        others); jobs written by `client.workflow()` and children of its members carry it already."""
        parents, mode = workflows.check_dependencies(depends_on, dependency_mode)
        if parents and unique_key is not None:
            raise DependencyInvalid("unique_key cannot be combined with depends_on")
        job = self._prepare(
            target, payload, queue=queue, priority=priority, tags=tags, scheduled_at=scheduled_at,
            max_attempts=max_attempts, schedule_to_close=schedule_to_close, unique_key=unique_key,
            unique_scope=unique_scope, concurrency_key=concurrency_key, fairness_key=fairness_key,
            workflow_id=workflow_id,
        )
        with tracing.producer(job.options.queue, job.options.actor, job.id) as trace_context:
            if trace_context is not None:
                job = replace(job, options=replace(job.options, trace_context=trace_context))
            if parents:
                await workflows.enqueue_dependent(self.backend, job, parents, mode, conn=connection)
                return JobHandle(job.id, client=self, result_adapter=self._adapter(target))
            inserted = await self.backend.job_insert_deferred(job, conn=connection)
        if inserted.holder is not None:
            return JobHandle(inserted.holder.id, client=self, row=inserted.holder, created=False,
                             result_adapter=self._adapter(inserted.holder.actor))
        return JobHandle(job.id, client=self, row_loader=inserted.row, result_adapter=self._adapter(target))

    async def enqueue_many(
        self,
        target: Actor[Any, R] | str,
        payloads: Iterable[Any],
        *,
        queue: str | None = None,
        priority: int | None = None,
        tags: Iterable[str] = (),
        scheduled_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        schedule_to_close: float | timedelta | None = None,
        connection: AsyncConnection[Any] | None = None,
        chunk_size: int = 5000,
        unique_key: str | bool | Sequence[str | None] | None = None,
        unique_scope: str = "active",
        depends_on: Iterable[workflows.ParentRef] | None = None,
        dependency_mode: str = "on_success",
        concurrency_key: str | None = None,
        fairness_key: str | Sequence[str | None] | None = None,
        workflow_id: UUID | str | None = None,
    ) -> list[JobHandle[R]]:
        """Validate every payload first, then write them all in one transaction (statements of at most
        `chunk_size` rows). One invalid payload writes nothing.

        `unique_key`: True derives each job's key from its payload; a sequence gives one key (or None)
        per payload; a string is one key for all (so at most one job is written). Each handle reports
        `created` for its own item; a skipped item's handle is the holder's (a job of this same call
        when two items share a key: the first one wins).

        `depends_on`: every job waits on the same parents (a fan-out), as in `enqueue`. `concurrency_key` is one key
        for all. `fairness_key`: one key for all, or a sequence with one key (or None) per payload (not with
        `depends_on`). `workflow_id`: every job joins that workflow, as in `enqueue`."""
        parents, mode = workflows.check_dependencies(depends_on, dependency_mode)
        if parents and unique_key is not None:
            raise DependencyInvalid("unique_key cannot be combined with depends_on")
        actor, opts = check_options(
            target, self.registry, queue=queue, priority=priority, tags=tags, scheduled_at=scheduled_at,
            max_attempts=max_attempts, schedule_to_close=schedule_to_close, concurrency_key=concurrency_key,
        )
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ConfigurationError(f"chunk_size must be a positive int, got {chunk_size!r}")
        if workflow_id is not None:
            opts = replace(opts, workflow_id=as_workflow_id(workflow_id))
        items = payloads if isinstance(payloads, list) else list(payloads)
        encoded = encode_payloads(actor, opts.actor, items, self.max_payload_bytes)
        opts, fair_keys = batch_fairness_keys(fairness_key, opts, len(encoded), dependent=bool(parents))
        keys = batch_unique_keys(unique_key, unique_scope, opts, encoded)
        ids = uuid7_many(len(encoded))
        if keys is None:
            order: list[int] | None = None
            rows_ids, rows_json = ids, encoded
        else:
            # rows in key order: concurrent batches with overlapping keys then wait on each other's
            # keys in one order, which cannot deadlock
            given = keys
            order = sorted(range(len(given)), key=lambda i: given[i] or "")
            rows_ids, rows_json, keys = [ids[i] for i in order], [encoded[i] for i in order], [given[i] for i in order]
            if fair_keys is not None:
                fair_keys = [fair_keys[i] for i in order]
        skipped: dict[int, UUID] = {}
        with tracing.producer(opts.queue, opts.actor, None, len(encoded)) as trace_context:
            if trace_context is not None:
                opts = replace(opts, trace_context=trace_context)
            batches = [
                JobBatch(ids=rows_ids[i : i + chunk_size], payloads_json=rows_json[i : i + chunk_size], options=opts,
                         unique_keys=None if keys is None else keys[i : i + chunk_size],
                         unique_scope=None if keys is None else unique_scope,
                         fairness_keys=None if fair_keys is None else fair_keys[i : i + chunk_size])
                for i in range(0, len(encoded), chunk_size)
            ]
            if parents:
                await workflows.enqueue_many_dependent(self.backend, batches, parents, mode, conn=connection)
            elif connection is not None:
                for start, batch in zip(range(0, len(encoded), chunk_size), batches, strict=True):
                    skipped |= offset_skipped(start, await self.backend.job_insert_many(batch, conn=connection))
            elif len(batches) == 1:
                skipped = await self.backend.job_insert_many(batches[0]) or {}
            elif batches:
                async with self.backend.transaction() as conn:
                    for start, batch in zip(range(0, len(encoded), chunk_size), batches, strict=True):
                        skipped |= offset_skipped(start, await self.backend.job_insert_many(batch, conn=conn))
        if order is not None and skipped:
            skipped = {order[pos]: holder for pos, holder in skipped.items()}
        adapter = self._adapter(target)
        if not skipped:
            return [JobHandle(job_id, client=self, result_adapter=adapter) for job_id in ids]
        return [
            JobHandle(skipped[i], client=self, result_adapter=adapter, created=False) if i in skipped
            else JobHandle(job_id, client=self, result_adapter=adapter)
            for i, job_id in enumerate(ids)
        ]

    async def get(self, job_id: UUID | str, *, result_adapter: TypeAdapter[R] | None = None) -> JobHandle[R] | None:
        """The job's handle with `.row` freshly read, or None if no such job exists."""
        row = await self.backend.get(as_job_id(job_id))
        if row is None:
            return None
        adapter = result_adapter if result_adapter is not None else self._adapter(row.actor)
        return JobHandle(row.id, client=self, row=row, result_adapter=adapter, created=False)

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
        return await job_ops.cancel_job(self.backend, job_id, reason)

    async def cancel_where(
        self, flt: JobFilter, reason: str | None = None, *, batch_size: int = 1000
    ) -> BulkCancelResult:
        """Cancel every matching unfinished job, in committed batches of `batch_size`. An empty filter
        is refused: say `JobFilter(unfinished=True)` to mean every job."""
        return await job_ops.cancel_jobs_where(self.backend, flt, reason, batch_size=batch_size)

    async def cancel_workflow(self, workflow_id: UUID | str, *, reason: str | None = None) -> WorkflowCancelResult:
        """Cancel every member of the workflow (`Workflow.id`: the jobs `client.workflow()` wrote and the children
        its members enqueued) that has not ended: waiting ones (sleeping and signal-waiting ones included) end
        cancelled at once; running ones get a cancel request and go through the ladder (cooperative, forced,
        abandoned) on their workers. Returns the counts per outcome (WorkflowCancelResult). WorkflowNotFound when
        no job carries the id."""
        return await job_ops.cancel_workflow(self.backend, workflow_id, reason)

    async def requeue(
        self, job_id: UUID | str, *, reason: str | None = None, attempts: int | None = None, cascade: bool = False,
        reset_steps: bool = False,
    ) -> RequeueResult:
        """Put a failed, crashed or abandoned job back to pending with `attempts` more attempts (default:
        its actor's max_attempts if registered here, else the job's own). attempt and claim_epoch are never
        lowered. Other statuses: nothing changes, `requeued` False. A unique key held by another job:
        nothing changes, `conflict_job_id` names it. KeyError if the job does not exist. `cascade`: the
        jobs the dependency cascade cancelled because of it (ParentFailed) wait for it again
        (`revived` lists them). `reset_steps`: the rerun starts over, forgetting the steps, sleeps and
        waits earlier attempts stored (kept by default, so that completed steps do not run again)."""
        return await job_ops.requeue_job(
            self.backend, job_id, reason=reason, attempts=attempts, registry=self.registry, cascade=cascade,
            reset_steps=reset_steps,
        )

    async def requeue_where(
        self,
        flt: JobFilter,
        *,
        reason: str | None = None,
        attempts: int | None = None,
        batch_size: int = 1000,
        progress: job_ops.Progress | None = None,
        cascade: bool = False,
        reset_steps: bool = False,
    ) -> BulkRequeueResult:
        """`requeue` every matching failed, crashed or abandoned job, in committed batches; counts by
        previous status, and the jobs left alone because their unique key is held (`conflicts`)."""
        return await job_ops.requeue_jobs_where(
            self.backend, flt, reason=reason, attempts=attempts, registry=self.registry,
            batch_size=batch_size, progress=progress, cascade=cascade, reset_steps=reset_steps,
        )

    # -- durable jobs (taskq.ops.durable) -----------------------------------------------------------

    async def signal(self, job_id: UUID | str, name: str, payload: Any = None) -> durable_ops.SignalResult:
        """Send signal `name` with a JSON `payload` to the job. It is kept, in order, until a
        `ctx.wait_for_signal(name)` of the job takes it (each signal once); a job suspended waiting for that
        name is due at once. JobNotFound for an unknown id, SignalRefused for a job that has ended,
        SignalInvalid for a bad name or payload (over 1 MiB): nothing is stored then."""
        return await durable_ops.send_signal(self.backend, job_id, name, payload)

    async def steps(self, job_id: UUID | str) -> list[StepRow]:
        """The steps, sleeps and waits the job's attempts stored, oldest first."""
        return await durable_ops.job_steps(self.backend, job_id)

    async def signals(self, job_id: UUID | str) -> list[SignalRow]:
        """The signals sent to the job, in order, with who took each."""
        return await durable_ops.job_signals(self.backend, job_id)

    # -- dependencies (taskq.workflows) -----------------------------------------------------------

    def workflow(self, *, connection: AsyncConnection[Any] | None = None) -> Workflow:
        """A graph builder: `async with client.workflow() as wf: a = wf.enqueue(...); b = wf.enqueue(...,
        depends_on=[a])`; written in one transaction (with `connection`, in that one) at the end of the
        block, nothing if it raises."""
        return Workflow(self, connection=connection)

    async def dependencies(self, job_id: UUID | str) -> list[workflows.DependencyEdge]:
        """The job's parents (their status now, and how each ended when its edge resolved) and children."""
        return await workflows.job_dependencies(self.backend, job_id)

    # -- schedules (taskq.ops.schedules) ---------------------------------------------------------

    async def list_schedules(self) -> list[ScheduleInfo]:
        return await schedule_ops.list_schedules(self.backend)

    async def pause_schedule(self, name: str, *, by: str | None = None) -> SchedulePauseResult:
        return await schedule_ops.pause_schedule(self.backend, name, by=by)

    async def resume_schedule(self, name: str) -> SchedulePauseResult:
        return await schedule_ops.resume_schedule(self.backend, name)

    async def trigger_schedule(self, name: str) -> ScheduleTriggerResult:
        return await schedule_ops.trigger_schedule(self.backend, name)

    # -- queues (taskq.ops.queues) --------------------------------------------------------------------

    async def queue_stats(self) -> QueueStatsReport:
        return await queue_ops.queue_stats(self.backend)

    async def pause_queue(self, name: str, *, reason: str | None = None, by: str | None = None) -> QueuePauseResult:
        return await queue_ops.pause_queue(self.backend, name, reason=reason, by=by)

    async def resume_queue(self, name: str, *, reason: str | None = None, by: str | None = None) -> QueuePauseResult:
        return await queue_ops.resume_queue(self.backend, name, reason=reason, by=by)

    async def set_queue_limits(
        self, name: str, *, concurrency: int | None = UNSET, concurrency_per_key: int | None = UNSET,
        rate_limit: int | None = UNSET, rate_period: float | None = UNSET, reason: str | None = None,
        by: str | None = None,
    ) -> QueueLimitsResult:
        """Fleet-wide limits of a queue (`taskq.ops.queues.set_queue_limits`): None removes a limit, one left
        out is kept; a rate is `rate_limit` starts per `rate_period` seconds."""
        return await queue_ops.set_queue_limits(
            self.backend, name, concurrency=concurrency, concurrency_per_key=concurrency_per_key,
            rate_limit=rate_limit, rate_period=rate_period, reason=reason, by=by,
        )

    async def set_fairness_weight(self, queue: str, key: str | None, weight: float, *, by: str | None = None
                                  ) -> FairnessWeightResult:
        """Fair share inside a queue (docs/fairness.md): the key's jobs get `weight` times the share of starts
        of a key of weight 1 (the default), among the keys with jobs ready at the same priority. Key ''
        (or None) is the jobs enqueued without a key. ConfigurationError for a bad key or weight (a finite
        number > 0, at most 1,000,000), QueueNotFound for a queue the database does not know."""
        return await queue_ops.set_fairness_weight(self.backend, queue, key, weight, by=by)

    async def fairness_weights(self, queue: str) -> dict[str, float]:
        """The queue's fairness weights other than the default 1, by key ('' = jobs without a key)."""
        return await queue_ops.fairness_weights(self.backend, queue)

    async def fair_keys(self, queue: str) -> list[FairKeyStats]:
        """Per fairness key of the queue: ready, scheduled, running, started in the last minute, weight."""
        return await queue_ops.fair_keys(self.backend, queue)


# -- workflows: graphs of jobs written in one transaction (docs/workflows.md) -----------------------


class WorkflowNode(Generic[R]):
    """A job of a Workflow not yet written: its id (made on the client) for `depends_on`, and after the
    block its handle."""

    def __init__(self, workflow: Workflow, graph_job: workflows.GraphJob, target: Actor[Any, R] | str) -> None:
        self.workflow = workflow
        self.job_id = graph_job.job.id
        self.graph_job = graph_job
        self._target = target
        self._handle: JobHandle[R] | None = None

    @property
    def handle(self) -> JobHandle[R]:
        """The written job's handle; RuntimeError before the workflow committed."""
        if self._handle is None:
            raise RuntimeError("the workflow has not been written yet (the handle exists after its block)")
        return self._handle

    def __repr__(self) -> str:
        return f"WorkflowNode({self.job_id}, {self.graph_job.job.options.actor})"


class Workflow:
    """`async with client.workflow() as wf:` collect jobs with `wf.enqueue(...)` (not awaited: nothing is
    written yet), each `depends_on` existing jobs or earlier nodes; at the end of a block that raised
    nothing, every job is written in one transaction; a block that raises writes nothing. `wf.id` names
    the workflow (jobs.workflow_id of its jobs and of their `ctx.jobs.enqueue` children)."""

    def __init__(self, client: JobsClient, *, connection: AsyncConnection[Any] | None = None) -> None:
        self.id: UUID = uuid7()
        """The workflow's id, made here (a uuid7, as job ids are): every job it writes carries it in
        `workflow_id`, and so does every child a member enqueues with `ctx.jobs.enqueue`. Known before the
        block ends; `JobsClient.cancel_workflow(wf.id)` cancels them all."""
        self._client = client
        self._connection = connection
        self._nodes: list[WorkflowNode[Any]] = []
        self._ids: set[UUID] = set()
        self.written = False

    @property
    def nodes(self) -> tuple[WorkflowNode[Any], ...]:
        return tuple(self._nodes)

    def enqueue(
        self,
        target: Actor[Any, R] | str,
        payload: Any,
        *,
        depends_on: Iterable[workflows.ParentRef] | None = None,
        dependency_mode: str = "on_success",
        **options: Any,
    ) -> WorkflowNode[R]:
        """Check one job (the options of JobsClient.enqueue) and add it to the graph."""
        if self.written:
            raise RuntimeError("this workflow was already written")
        for ref in depends_on or ():
            if isinstance(ref, WorkflowNode) and ref.workflow is not self:
                raise DependencyInvalid(f"depends_on: {ref!r} belongs to another workflow")
        parents, mode = workflows.check_dependencies(depends_on, dependency_mode)
        if parents and options.get("unique_key") is not None:
            raise DependencyInvalid("unique_key cannot be combined with depends_on")
        given = options.pop("workflow_id", None)
        if given is not None and as_workflow_id(given) != self.id:
            raise ConfigurationError(f"workflow_id: a job of workflow {self.id} cannot join another workflow")
        job = self._client._prepare(target, payload, workflow_id=self.id, **options)
        node: WorkflowNode[R] = WorkflowNode(self, workflows.GraphJob(job, parents, mode), target)
        self._nodes.append(node)
        self._ids.add(job.id)
        return node

    async def write(self) -> None:
        graph = [n.graph_job for n in self._nodes]
        inserted = await workflows.enqueue_graph(self._client.backend, graph, conn=self._connection)
        self.written = True
        for node, row in zip(self._nodes, inserted, strict=True):
            # a job with parents: its row (remaining count, mode) is read on refresh()
            loader = row.row if not node.graph_job.parent_ids else None
            node._handle = JobHandle(row.job_id, client=self._client, row_loader=loader,
                                     result_adapter=self._client._adapter(node._target))

    async def __aenter__(self) -> Workflow:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            await self.write()

