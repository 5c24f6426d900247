"""JobContext: what an actor sees of its job, its cancellation and its worker."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from uuid import UUID

from taskq.models import CancelOrigin

if TYPE_CHECKING:
    from taskq.actors.declaration import Actor
    from taskq.client import JobHandle

__all__ = ["CancelOrigin", "ContextRuntime", "JobContext"]

P = TypeVar("P")


class ContextRuntime(Protocol):
    """What the worker provides behind a JobContext (persistence of progress, child enqueues)."""

    async def save_progress(self, ctx: JobContext[Any], data: Any, message: str | None) -> None: ...

    async def enqueue_child(
        self, ctx: JobContext[Any], target: Actor[Any, Any] | str, payload: Any, options: dict[str, Any]
    ) -> JobHandle[Any]: ...

    async def parent_results(self, ctx: JobContext[Any]) -> dict[UUID, Any]: ...


class ChildJobs:
    """`ctx.jobs`: enqueue jobs whose parent_id is this job. Their handles have no client (spec §2)."""

    def __init__(self, ctx: JobContext[Any]) -> None:
        self._ctx = ctx

    async def enqueue(
        self,
        target: Actor[Any, Any] | str,
        payload: Any,
        *,
        queue: str | None = None,
        priority: int | None = None,
        tags: Iterable[str] = (),
        scheduled_at: datetime | timedelta | None = None,
        max_attempts: int | None = None,
        schedule_to_close: float | timedelta | None = None,
        unique_key: str | bool | None = None,
        unique_scope: str = "active",
        depends_on: Iterable[Any] | None = None,
        dependency_mode: str = "on_success",
        concurrency_key: str | None = None,
        fairness_key: str | None = None,
    ) -> JobHandle[Any]:
        """As `JobsClient.enqueue`; with a unique key held by another job, returns that job's handle
        with `created` False. `depends_on` (handles or ids) and `dependency_mode` as for the client."""
        options = {
            "queue": queue, "priority": priority, "tags": tuple(tags), "scheduled_at": scheduled_at,
            "max_attempts": max_attempts, "schedule_to_close": schedule_to_close,
            "unique_key": unique_key, "unique_scope": unique_scope,
            "depends_on": depends_on, "dependency_mode": dependency_mode,
            "concurrency_key": concurrency_key, "fairness_key": fairness_key,
        }
        return await self._ctx._runtime.enqueue_child(self._ctx, target, payload, options)

    def enqueue_sync(self, target: Actor[Any, Any] | str, payload: Any, **options: Any) -> JobHandle[Any]:
        """From a thread actor: marshalled onto the worker's event loop and awaited."""
        handle: JobHandle[Any] = self._ctx._call_on_loop(self.enqueue(target, payload, **options))
        return handle


class JobContext(Generic[P]):
    """Passed to an actor as its second argument.

    `cancellation_requested` is a cheap, non-blocking check; `cancel_event` can be awaited;
    `cancel_origin` tells an operator's cancel (the job ends) from a shutdown (it is released and
    re-run). `progress()` persists a checkpoint that the next attempt reads back as `last_progress`.
    """

    def __init__(
        self,
        *,
        job_id: UUID,
        attempt: int,
        claim_epoch: int,
        payload: P,
        actor_name: str,
        last_progress: Any,
        runtime: ContextRuntime,
        loop: asyncio.AbstractEventLoop,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
        scheduled_for: datetime | None = None,
    ) -> None:
        self.job_id = job_id
        self.scheduled_for = scheduled_for
        """The nominal slot time when a schedule made this job (a trigger's own instant); else None."""
        self.attempt = attempt
        self.claim_epoch = claim_epoch
        self.payload = payload
        self.actor_name = actor_name
        self.last_progress = last_progress
        self.cancel_event = asyncio.Event()
        self.cancel_origin: CancelOrigin | None = None
        self._runtime = runtime
        self._loop = loop
        # set together with cancel_event; a plain attribute read is atomic, so an actor thread can
        # poll it without touching the loop
        self._cancelled = False
        self._logger = logger

    @property
    def logger(self) -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
        """A logger bound to this job (job_id and attempt in `extra`), made on first use."""
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                logging.getLogger("taskq.job"), {"job_id": str(self.job_id), "attempt": self.attempt}
            )
        return self._logger

    @property
    def jobs(self) -> ChildJobs:
        """Enqueue child jobs (parent_id = this job). Built on access: a stored back-reference would
        make every context a reference cycle left to the cyclic garbage collector."""
        return ChildJobs(self)

    @property
    def cancellation_requested(self) -> bool:
        return self._cancelled

    def request_cancel(self, origin: CancelOrigin) -> None:
        """Called by the worker on its loop: record why first, then signal. The first origin sticks,
        except that an operator's request always wins over an infrastructure one."""
        if self.cancel_origin is None or origin is CancelOrigin.OPERATOR:
            self.cancel_origin = origin
        self._cancelled = True
        self.cancel_event.set()

    async def progress(self, data: Any = None, *, message: str | None = None) -> None:
        """Persist a progress checkpoint (JSON-able `data` and/or a message) on the job row."""
        await self._runtime.save_progress(self, data, message)

    async def parent_results(self) -> dict[UUID, Any]:
        """{parent id: result} for every job this one was enqueued to depend on (`depends_on`): a succeeded
        parent's result, typed by its actor's result type when the actor is registered in this worker
        (the stored JSON value otherwise); None for a parent that ended otherwise (mode on_any_terminal).
        Empty for a job without parents."""
        return await self._runtime.parent_results(self)

    def parent_results_sync(self) -> dict[UUID, Any]:
        """`parent_results()` for thread actors: marshalled onto the worker's event loop and awaited."""
        results: dict[UUID, Any] = self._call_on_loop(self.parent_results())
        return results

    def progress_sync(self, data: Any = None, *, message: str | None = None) -> None:
        """`progress()` for thread actors: marshalled onto the worker's event loop and awaited."""
        self._call_on_loop(self.progress(data, message=message))

    def _call_on_loop(self, coro: Any) -> Any:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            coro.close()
            raise RuntimeError(
                "use the async form (await ctx.progress / ctx.jobs.enqueue / ctx.parent_results) on the event loop"
            )
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()
