"""Consumers: one asyncio task per claimed job. Run the actor through its executor, decide the
outcome, write it (fenced, batched), then run the hooks."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NoReturn

from taskq import tracing, workflows
from taskq.actors.declaration import Actor, ActorRegistry
from taskq.actors.executors import Executor
from taskq.backend import durable as durable_store
from taskq.backend.workers import RETRY, ClaimedJob, Finish
from taskq.client import JobHandle
from taskq.context import SLEEP, JobContext, JobSuspended
from taskq.enqueue import encode_payload, prepare_insert
from taskq.exceptions import DependencyInvalid, LeaseLost, PayloadInvalid, ResultInvalid, Snooze
from taskq.metrics import JOB_DURATION, JOBS_COMPLETED, JOBS_SNOOZED
from taskq.models import CancelMarker, CancelOrigin, CancelPhase, JobStatus
from taskq.worker import transaction as job_tx
from taskq.worker.decisions import confirm_before_start
from taskq.worker.hooks import Hooks
from taskq.worker.registry import ActiveJob

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from taskq.backend import Backend
    from taskq.backend.durable import StoredStep, TakenSignal
    from taskq.backend.workers import WorkerStore
    from taskq.logs import JobLines
    from taskq.worker.completer import Completer
    from taskq.worker.registry import ActiveJobRegistry

log = logging.getLogger("taskq.worker")

TERMINAL_NAMES = tuple(s.value for s in JobStatus if s.is_terminal)

MAX_ERROR_MESSAGE = 4000


def _message(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return text if len(text) <= MAX_ERROR_MESSAGE else text[: MAX_ERROR_MESSAGE - 3] + "..."


def cancel_marker(entry: ActiveJob) -> CancelMarker:
    return CancelMarker.COOPERATIVE if entry.cancel_phase <= CancelPhase.COOPERATIVE else CancelMarker.FORCED


def decide_after_failure(actor: Actor[Any, Any], job: ClaimedJob, exc: BaseException, error_class: str) -> Finish:
    """Retry into `scheduled` with the actor's backoff while budget (and deadline) allow, else fail."""
    base = Finish(
        job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed", outcome="failed",
        error_class=error_class, error_message=_message(exc),
    )
    if actor.retry_kind(exc) != "retry":
        base.detail = {"retryable": False}
        return base
    if job.attempt >= job.max_attempts:
        base.detail = {"retries_exhausted": True}
        return base
    delay = actor.retry.delay(job.attempt)
    if job.schedule_to_close is not None and time.time() + delay >= job.schedule_to_close.timestamp():
        base.detail = {"retry_past_deadline": True}
        return base
    base.status = RETRY
    base.outcome = "retried"
    base.retry_delay = delay
    base.detail = {"retry_in": round(delay, 3)}
    return base


def _note_first_attempt(entry: ActiveJob, finish: Finish) -> None:
    """A traced attempt that will run again: the first one writes its span down for the later ones' links."""
    stored = entry.job.trace_context
    if stored is not None and tracing.FIRST_ATTEMPT in json.loads(stored):
        return
    traceparent = entry.span.traceparent()
    if traceparent is not None:
        finish.trace_first = json.dumps({tracing.FIRST_ATTEMPT: traceparent})


class Consumers:
    """The consumer side of one worker: spawns a task per claimed job and owns its terminal write.

    `executor_for(actor)` picks the executor of the actor's isolation; `release(entries)` gives an
    attempt a shutdown interrupted back to the fleet; `on_done(isolation)` follows the end of each consumer
    task (a slot of that isolation class is free); `job_log`, when set, writes the INFO line at each
    attempt's start and finish. With `lock_timeout`, an actor whose claim is older than half of it when it is
    about to start runs only once the database confirms the row is still ours (decisions.confirm_before_start)."""

    def __init__(
        self,
        registry: ActiveJobRegistry,
        actors: ActorRegistry,
        backend: Backend,
        store: WorkerStore,
        completer: Completer,
        hooks: Hooks,
        *,
        executor_for: Callable[[Actor[Any, Any]], Executor],
        release: Callable[[Sequence[ActiveJob]], Awaitable[None]],
        on_done: Callable[[str], None],
        job_log: JobLines | None,
        lock_timeout: float | None = None,
    ) -> None:
        self._registry = registry
        self._actors = actors
        self._backend = backend
        self._store = store
        self._completer = completer
        self._hooks = hooks
        self._executor_for = executor_for
        self._release = release
        self._on_done = on_done
        self._job_log = job_log
        self._lock_timeout = lock_timeout
        self.tasks: set[asyncio.Task[None]] = set()
        self._done_of: dict[str, Callable[[asyncio.Task[None]], None]] = {}
        """The done callback of each isolation class's consumer tasks, made once per class, not per job."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._completed = {s: JOBS_COMPLETED.labels(status=s)
                           for s in (*TERMINAL_NAMES, "retried", "snoozed", "suspended")}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def spawn(self, job: ClaimedJob) -> None:
        running = self._registry.get(job.id)
        if (running is not None and running.job.attempt == job.attempt and running.job.claim_epoch == job.claim_epoch
                and running.task is not None and not running.task.done()):
            # The database handed this worker a claim it already runs, with the same attempt and epoch: the
            # earlier claim's commit was lost (a failover to a standby that had not received it) and the
            # job was claimed again, by us. The attempt in progress is this claim's execution: running it
            # a second time would repeat its effects, and its writes pass the new claim's fence.
            log.warning("job %s attempt %d (claim epoch %d) was claimed again while it runs here: the earlier "
                        "claim was lost by the database (a failover?); the run in progress keeps the claim",
                        job.id, job.attempt, job.claim_epoch)
            return
        entry = ActiveJob(job=job)
        self._registry.add(entry)
        task = self.loop.create_task(self._consume(entry))
        entry.task = task
        self.tasks.add(task)
        done = self._done_of.get(entry.isolation)
        if done is None:
            done = self._done_of[entry.isolation] = functools.partial(self._done, entry.isolation)
        task.add_done_callback(done)

    def _done(self, isolation: str, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self._on_done(isolation)
        if not task.cancelled() and task.exception() is not None:
            log.error("consumer task crashed", exc_info=task.exception())

    async def _consume(self, entry: ActiveJob) -> None:
        try:
            await self._execute(entry)
        finally:
            if entry.ctx is not None and entry.ctx.transaction_open is not None:
                await job_tx.abandon(entry.ctx)  # the actor failed or was stopped with its transaction open
            for timer in entry.timers:
                timer.cancel()
            if entry.cancel_phase < CancelPhase.ABANDON_PENDING:
                self._registry.remove(entry.id, entry)

    async def _execute(self, entry: ActiveJob) -> None:
        job = entry.job
        actor = self._actors.get(job.actor)
        if actor is None:
            # the job's row is readable by whoever may read its queue: the worker's catalogue goes to its log
            log.warning("job %s: no actor named %r in this worker; it knows %s", job.id, job.actor,
                        ", ".join(self._actors.names()) or "none")
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="UnknownActor",
                error_message=(
                    f"no actor named {job.actor!r} is registered in this worker; deploy a worker that "
                    "registers it and enqueue the job again"
                ),
                detail={"retryable": False},
            ))
            return
        if not actor.allows_queue(job.queue):
            # a job put in a queue its actor is not bound to (by a producer that did not know the actor):
            # its code never runs, so that who may enqueue into a queue cannot start another queue's work
            log.warning("job %s: actor %r is not bound to queue %r (it runs on %s); failed without running",
                        job.id, actor.name, job.queue, list(actor.queues))
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="ActorQueueMismatch",
                error_message=(
                    f"actor {actor.name!r} may not run on queue {job.queue!r}: it runs on "
                    f"{list(actor.queues)!r} only; enqueue it there, or allow the queue with "
                    "@actor(queues=[...]) and requeue the job"
                ),
                detail={"retryable": False},
            ))
            return
        entry.actor = actor
        try:
            payload = actor.validate_json_payload(job.payload)
        except PayloadInvalid as exc:
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="PayloadInvalid",
                error_message=f"{exc}; fix the producer (or the actor's payload type) and enqueue again",
                detail={"retryable": False},
            ))
            return
        if job.schedule_to_close is not None and job.schedule_to_close <= datetime.now(UTC):
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="DeadlineExceeded",
                error_message="schedule_to_close passed before this attempt could start",
            ))
            return
        if not actor.idempotent and job.idempotent:
            # enqueued by name: say so on the row before the actor can have any effect, so that a reclaimer
            # that does not know the actor never re-runs it after a crash (idempotent actors pay nothing)
            if not await self._store.mark_not_idempotent(job):
                log.warning("job %s attempt %d: no longer holds the row; not started", job.id, job.attempt)
                entry.finishing = True
                return
            job.idempotent = False
        lock_timeout = self._lock_timeout
        if (lock_timeout is not None and confirm_before_start(job.claim_sent, time.monotonic(), lock_timeout)
                and not await self._still_ours(entry, lock_timeout)):
            log.warning("job %s attempt %d: claimed %.1fs ago (lock_timeout %gs) and no longer held by this worker "
                        "(the process was frozen or its event loop blocked); not started", job.id, job.attempt,
                        time.monotonic() - (job.claim_sent or 0.0), lock_timeout)
            entry.finishing = True
            return
        loop = self.loop
        progress = json.loads(job.progress) if job.progress is not None else None
        last = progress.get("data") if isinstance(progress, dict) else None
        entry.ctx = JobContext(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, payload=payload,
            actor_name=actor.name, last_progress=last, runtime=self, loop=loop, scheduled_for=job.scheduled_for,
        )
        entry.executor = self._executor_for(actor)
        if entry.cancel_origin is not None:  # a cancel (or shutdown) arrived before the actor started
            entry.ctx.request_cancel(entry.cancel_origin)
        self._arm_timers(entry, actor, loop)
        with tracing.consumer(job, actor.isolation) as span:
            entry.span = span
            if self._job_log is not None:
                self._job_log.started(job)
            started = loop.time()
            ctx = entry.ctx
            try:
                result = await entry.executor.run(entry)
            except asyncio.CancelledError:
                ctx.returned = True
                operator = entry.cancel_origin is CancelOrigin.OPERATOR
                self._ended(span, job, started, "cancelled" if operator else "stopped",
                            cancel_marker(entry).value if operator else None, entry.cancel_origin or entry.stop_cause)
                await self._on_cancelled(entry, actor)
                raise
            except (Exception, JobSuspended) as exc:
                ctx.returned = True
                if ctx.suspension is not None:  # a sleep or a wait, whatever the actor raised on its way out
                    self._ended(span, job, started, "suspended", None, str(ctx.suspension))
                    await self._on_suspend(entry, actor, ctx.suspension)
                elif isinstance(exc, Snooze):
                    self._ended(span, job, started, "snoozed", None, f"for {exc.delay:g} s")
                    await self._on_snooze(entry, actor, exc)
                else:
                    failure = exc if isinstance(exc, Exception) else RuntimeError(str(exc))
                    self._ended(span, job, started, "failed", type(exc).__name__, type(exc).__name__)
                    await self._on_failure(entry, actor, failure)
            else:
                ctx.returned = True
                if ctx.suspension is not None:  # the actor caught the suspension and returned
                    self._ended(span, job, started, "suspended", None, str(ctx.suspension))
                    await self._on_suspend(entry, actor, ctx.suspension)
                else:
                    self._ended(span, job, started, "succeeded", None, None)
                    await self._on_success(entry, actor, result)

    async def _still_ours(self, entry: ActiveJob, lock_timeout: float) -> bool:
        """The database's word that the row is still this attempt's, its lease renewed (the reconcile statement,
        fenced on the claim epoch). When the database cannot answer, the actor starts as it would have: its
        writes are fenced, and the heartbeat decides about the lease."""
        job = entry.job
        try:
            async with self._backend.transaction() as conn:
                held = await self._store.reconcile(conn, [(job.id, job.claim_epoch)], lock_timeout)
        except Exception as exc:
            log.warning("job %s attempt %d: could not confirm the claim before starting (%s); starting", job.id,
                        job.attempt, exc)
            return True
        return job.id in held

    def _ended(self, span: Any, job: ClaimedJob, started: float, outcome: str, error_type: str | None,
               detail: str | None) -> None:
        """What every way out of an attempt records: its duration, its span's outcome, its log line."""
        elapsed = self.loop.time() - started
        JOB_DURATION.observe(elapsed)
        if span is not None:
            span.outcome(outcome, error_type)
        if self._job_log is not None:
            self._job_log.finished(job, outcome, elapsed, detail)

    def _arm_timers(self, entry: ActiveJob, actor: Actor[Any, Any], loop: asyncio.AbstractEventLoop) -> None:
        if actor.timeout is not None:
            entry.timers.append(loop.call_later(actor.timeout, self._stop_attempt, entry, "timeout"))
        deadline = entry.job.schedule_to_close
        if deadline is not None:
            remaining = deadline.timestamp() - time.time()
            entry.timers.append(loop.call_later(max(0.0, remaining), self._stop_attempt, entry, "deadline"))

    def _stop_attempt(self, entry: ActiveJob, cause: str) -> None:
        """Per-attempt timeout or schedule_to_close: force the attempt to stop (the force path)."""
        if entry.finishing or entry.stop_cause is not None or entry.cancel_origin is not None:
            return
        entry.stop_cause = cause
        log.warning("job %s attempt %d: %s reached, forcing the attempt to stop", entry.id, entry.attempt, cause)
        entry.request_cancel(CancelOrigin.TIMEOUT)
        if entry.executor is not None:
            entry.executor.force_cancel(entry)

    # -- outcomes --------------------------------------------------------------------------------

    async def _on_success(self, entry: ActiveJob, actor: Actor[Any, Any], result: Any) -> None:
        job = entry.job
        try:
            raw = actor.result_adapter.dump_json(result)
            if b"\\u0000" in raw:
                raise ValueError("it contains a NUL character, which PostgreSQL cannot store")
            result_json = raw.decode("utf-8")
        except Exception as exc:
            err = ResultInvalid(f"actor {actor.name!r} returned a result that cannot be stored: {exc}")
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="ResultInvalid", error_message=_message(err),
                detail={"retryable": False},
            ))
            return
        detail = {"cancel_requested": True} if entry.cancel_origin is CancelOrigin.OPERATOR else None
        finish = Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="succeeded",
            outcome="succeeded", result_json=result_json, detail=detail,
        )
        if entry.ctx is not None and entry.ctx.transaction_open is not None:
            # ctx.transaction(): the success commits in the actor's own transaction, or nothing of it does
            entry.finishing = True
            written = await job_tx.commit_with(entry.ctx, self._store, finish)
            if written is not None:
                self._completed[written].inc()
        else:
            written = await self._write(entry, finish)
        if written and actor.on_success is not None:
            await self._hooks.run(actor.on_success, entry, actor.hook_timeout, "on_success")

    async def _on_snooze(self, entry: ActiveJob, actor: Actor[Any, Any], snooze: Snooze) -> None:
        """The actor asked to run again later: back to scheduled, its attempt given back to the budget."""
        job = entry.job
        if await self._later(entry, actor, "Snooze", Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status=RETRY, outcome="snoozed",
            retry_delay=snooze.delay, detail={"delay": snooze.delay},
        )) == RETRY:
            JOBS_SNOOZED.inc()

    async def _on_suspend(self, entry: ActiveJob, actor: Actor[Any, Any], suspension: JobSuspended) -> None:
        """A sleep or a wait for a signal: back to scheduled until its wake-up (no end for a wait without
        timeout), its attempt given back, no worker, no lease."""
        job = entry.job
        until = suspension.until
        delay = math.inf if until is None else max(0.0, (until - datetime.now(UTC)).total_seconds())
        detail: dict[str, Any] = {"until": until.isoformat() if until is not None else None}
        if suspension.signal is not None:
            detail["signal"] = suspension.signal
        await self._later(entry, actor, "JobSuspended", Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status=RETRY,
            outcome="sleeping" if suspension.kind == SLEEP else "waiting", retry_delay=delay, detail=detail,
            wait_kind=suspension.kind, wait_signal=suspension.signal,
        ))

    async def _later(self, entry: ActiveJob, actor: Actor[Any, Any], raised: str, finish: Finish) -> str | None:
        """A snooze or a suspension: a chosen outcome like a success, so a stopping worker writes it too; an
        operator's cancel wins (the actor stopped for it, or the database turns the retry into a cancel if the
        request is newer: then on_cancel runs); a lost lease writes nothing. The status written, or None."""
        if entry.cancel_origin is CancelOrigin.OPERATOR:
            await self._write_cancelled(entry, actor, detail={"raised": raised})
            return None
        if entry.cancel_origin is CancelOrigin.LEASE_LOST:
            return None
        written = await self._write(entry, finish)
        if written == "cancelled" and actor.on_cancel is not None:
            await self._hooks.run(actor.on_cancel, entry, actor.on_cancel_timeout, "on_cancel")
        return written

    async def _on_failure(self, entry: ActiveJob, actor: Actor[Any, Any], exc: Exception) -> None:
        job = entry.job
        if entry.cancel_origin is CancelOrigin.OPERATOR:
            # the operator asked this job to stop: an exception on the way out ends it cancelled
            await self._write_cancelled(entry, actor, detail={"raised": type(exc).__name__})
            return
        if entry.cancel_origin is CancelOrigin.SHUTDOWN or entry.cancel_origin is CancelOrigin.LEASE_LOST:
            await self._release_or_drop(entry)
            return
        finish = decide_after_failure(actor, job, exc, type(exc).__name__)
        log.info("job %s attempt %d failed with %s -> %s", job.id, job.attempt, type(exc).__name__, finish.status)
        await self._after_failure(entry, actor, finish, await self._write(entry, finish))

    async def _after_failure(self, entry: ActiveJob, actor: Actor[Any, Any], finish: Finish,
                             written: str | None) -> None:
        """Hooks for a failure's outcome. A retry the database turned into a cancel (the operator's request
        committed before the failure was written) is a cancel: on_cancel, not a retry."""
        if written == "failed" and actor.on_retry_exhausted is not None:
            await self._hooks.run(actor.on_retry_exhausted, entry, actor.hook_timeout, "on_retry_exhausted")
        elif written == "cancelled" and finish.status == RETRY and actor.on_cancel is not None:
            await self._hooks.run(actor.on_cancel, entry, actor.on_cancel_timeout, "on_cancel")

    async def _on_cancelled(self, entry: ActiveJob, actor: Actor[Any, Any]) -> None:
        """The actor ended with CancelledError: decide by why it was stopped, never by the exception."""
        if entry.cancel_phase >= CancelPhase.ABANDON_PENDING:
            return  # run_post_tx owns the terminal write
        origin = entry.cancel_origin
        job = entry.job
        if origin is CancelOrigin.OPERATOR:
            await self._write_cancelled(entry, actor)
        elif origin is CancelOrigin.TIMEOUT and entry.stop_cause == "deadline":
            await self._write(entry, Finish(
                job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="failed",
                outcome="failed", error_class="DeadlineExceeded",
                error_message="schedule_to_close passed while the attempt was running",
            ))
        elif origin is CancelOrigin.TIMEOUT:
            exc = TimeoutError(f"attempt {job.attempt} exceeded the actor's timeout of {actor.timeout} s")
            await self._on_timeout(entry, actor, exc)
        elif origin is CancelOrigin.LEASE_LOST:
            log.warning("job %s attempt %d stopped: this worker no longer holds its lease", job.id, job.attempt)
        else:
            # SHUTDOWN, or a bare cancellation of the worker (stamped SHUTDOWN by the teardown path)
            await self._release_or_drop(entry)

    async def _on_timeout(self, entry: ActiveJob, actor: Actor[Any, Any], exc: TimeoutError) -> None:
        finish = decide_after_failure(actor, entry.job, exc, "AttemptTimeout")
        await self._after_failure(entry, actor, finish, await self._write(entry, finish))

    async def _write_cancelled(self, entry: ActiveJob, actor: Actor[Any, Any] | None,
                               detail: dict[str, Any] | None = None) -> bool:
        job = entry.job
        marker = cancel_marker(entry)
        written = await self._write(entry, Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="cancelled",
            outcome="cancelled", error_class=marker.value,
            error_message=f"cancelled at phase {int(entry.cancel_phase)}",
            detail={"cancel_phase": int(min(entry.cancel_phase, CancelPhase.FORCED)), **(detail or {})},
        ))
        if written and actor is not None and actor.on_cancel is not None:
            await self._hooks.run(actor.on_cancel, entry, actor.on_cancel_timeout, "on_cancel")
        return written is not None

    async def _release_or_drop(self, entry: ActiveJob) -> None:
        """Shutdown interruption: an operator cancel on the row wins (cancelled, forced); otherwise the
        row goes back to the fleet. A lost lease writes nothing."""
        if entry.cancel_origin is CancelOrigin.LEASE_LOST:
            return
        await self._release([entry])

    async def _write(self, entry: ActiveJob, finish: Finish) -> str | None:
        """The status written (a retry over an operator's cancel request comes back 'cancelled'), or None."""
        entry.finishing = True
        if finish.status == RETRY and entry.span is not None:
            _note_first_attempt(entry, finish)
        try:
            written = await self._completer.finish(finish)
        except Exception as exc:
            log.error("job %s: outcome %s not written (%s); its lease will expire and the sweeper "
                      "will decide", entry.id, finish.status, exc)
            return None
        if written is not None:
            self._completed[written if written != RETRY else "snoozed" if finish.outcome == "snoozed"
                            else "suspended" if finish.wait_kind is not None else "retried"].inc()
        return written

    # -- ContextRuntime --------------------------------------------------------------------------

    async def save_progress(self, ctx: JobContext[Any], data: Any, message: str | None) -> None:
        doc = encode_payload(None, ctx.actor_name, {"data": data, "message": message}, 1024 * 1024)
        held = await self._store.save_progress(ctx.job_id, ctx.attempt, ctx.claim_epoch, doc)
        if not held:
            log.warning("job %s: progress not saved, attempt %d no longer holds the row", ctx.job_id, ctx.attempt)
        ctx.last_progress = data

    async def enqueue_child(
        self, ctx: JobContext[Any], target: Actor[Any, Any] | str, payload: Any, options: dict[str, Any]
    ) -> JobHandle[Any]:
        options = dict(options)
        parents, mode = workflows.check_dependencies(options.pop("depends_on", None),
                                                     options.pop("dependency_mode", "on_success"))
        # a child joins its parent's workflow (read here: the claim statements stay as lean as they are)
        workflow_id = options.pop("workflow_id", None)
        if workflow_id is None:
            if not ctx.workflow_read:  # once per attempt, not per child: a member's workflow does not change
                ctx.workflow_id = await self._backend.job_workflow_id(ctx.job_id)
                ctx.workflow_read = True
            workflow_id = ctx.workflow_id
        job = prepare_insert(target, payload, registry=self._actors, max_payload_bytes=1024 * 1024,
                             parent_id=ctx.job_id, workflow_id=workflow_id, **options)
        if parents and job.unique_key is not None:
            raise DependencyInvalid("unique_key cannot be combined with depends_on")
        entry = self._registry.get(ctx.job_id)
        # the producer span is a child of the enqueuing attempt's consumer span, in whatever thread or task
        # the actor called from
        with tracing.producer(job.options.queue, job.options.actor, job.id,
                              parent=entry.span if entry is not None else None) as trace_context:
            if trace_context is not None:
                job = replace(job, options=replace(job.options, trace_context=trace_context))
            if parents:
                inserted = await workflows.enqueue_dependent(self._backend, job, parents, mode)
            else:
                inserted = await self._backend.job_insert_deferred(job)
        row = inserted.row()
        return JobHandle(row.id, client=None, row=row, created=inserted.created)

    async def parent_results(self, ctx: JobContext[Any]) -> dict[Any, Any]:
        return await workflows.parent_results(self._backend, ctx.job_id, self._actors)

    # durable jobs (taskq.context, sql/durable.sql): every write is fenced; a refused one means this attempt
    # lost the job, and it stops as on any lost lease

    async def load_steps(self, ctx: JobContext[Any]) -> list[StoredStep]:
        async with self._backend.pool.connection() as conn:
            return await durable_store.load_steps(conn, ctx.job_id)

    async def save_step(self, ctx: JobContext[Any], kind: str, name: str, *, result_json: str | None = None,
                        delay: float | None = None, wake_at: datetime | None = None
                        ) -> tuple[datetime | None, bool]:
        async with self._backend.pool.connection() as conn:
            held, stored_wake, due = await durable_store.save_step(
                conn, ctx.job_id, ctx.attempt, ctx.claim_epoch, kind=kind, name=name,
                worker_id=self._store.worker_id, result_json=result_json, delay=delay, wake_at=wake_at)
        if not held:
            self._lost(ctx, f"{kind} {name!r} not stored")
        return stored_wake, due

    async def take_signal(self, ctx: JobContext[Any], name: str, wait: str) -> TakenSignal:
        async with self._backend.pool.connection() as conn:
            taken = await durable_store.take_signal(conn, ctx.job_id, ctx.attempt, ctx.claim_epoch,
                                                    name=name, wait=wait, worker_id=self._store.worker_id)
        if not taken.held:
            self._lost(ctx, f"signal {name!r} not taken")
        return taken

    async def signal_timeout(self, ctx: JobContext[Any], wait: str) -> None:
        async with self._backend.pool.connection() as conn:
            held = await durable_store.signal_timeout(conn, ctx.job_id, ctx.attempt, ctx.claim_epoch, wait=wait,
                                                      worker_id=self._store.worker_id)
        if not held:
            self._lost(ctx, f"the timeout of wait {wait!r} not stored")

    def transaction(self, ctx: JobContext[Any]) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        return job_tx.JobTransaction(ctx, self._backend.pool, self._store.worker_id, lost=self._lost)

    def _lost(self, ctx: JobContext[Any], what: str) -> NoReturn:
        """A fenced durable write was refused: this attempt no longer holds the job. Stop it as on a lost
        lease (nothing more is written for it) and tell the actor."""
        log.warning("job %s attempt %d: %s, the attempt no longer holds the job; stopping it",
                    ctx.job_id, ctx.attempt, what)
        entry = self._registry.get(ctx.job_id)
        if entry is not None and entry.ctx is ctx:
            entry.drop_lease()
        raise LeaseLost(f"job {ctx.job_id} attempt {ctx.attempt} no longer holds the job: {what}")


__all__ = ["Consumers", "Executor", "Hooks", "cancel_marker", "decide_after_failure"]
