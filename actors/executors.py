"""Executors run an actor's body and know how to stop it: the one seam between the worker's
cancellation ladder and the way an actor is isolated (asyncio task, thread, child process).

The consumer awaits `run()`; the ladder calls `request_cancel` at phase 1, `force_cancel` at phase 2
and `kill` once both graces are spent; the worker awaits `reap()` on its way out. Whatever the
isolation, an actor stopped by the worker surfaces from `run()` as `asyncio.CancelledError`, so the
consumer decides the outcome by the recorded cancel origin, never by the exception.

What an executor runs is an `Execution`: the attempt as the executors see it (the worker's ActiveJob
satisfies it), so that the executors never import the worker.

Thread isolation lives in `taskq.actors.thread`, process isolation in `taskq.actors.process` (imported
lazily: it is only needed by workers that run process actors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio
    from uuid import UUID

    from taskq.actors.declaration import Actor
    from taskq.context import JobContext
    from taskq.models import CancelOrigin

__all__ = [
    "AsyncioExecutor",
    "Execution",
    "Executor",
    "call_actor",
]


class Execution(Protocol):
    """One attempt of one job, as an executor runs and stops it. Read only: the worker owns the state."""

    @property
    def id(self) -> UUID: ...

    @property
    def attempt(self) -> int: ...

    @property
    def claim_epoch(self) -> int: ...

    @property
    def actor(self) -> Actor[Any, Any] | None: ...

    @property
    def ctx(self) -> JobContext[Any] | None: ...

    @property
    def task(self) -> asyncio.Task[Any] | None:
        """The consumer task awaiting the executor's run()."""

    @property
    def cancel_origin(self) -> CancelOrigin | None: ...

    @property
    def stop_cause(self) -> str | None: ...


def call_actor(entry: Execution) -> Any:
    """Call the actor's function with the job's payload (and context, when it takes one)."""
    assert entry.actor is not None and entry.ctx is not None
    if entry.actor.takes_context:
        return entry.actor.fn(entry.ctx.payload, entry.ctx)
    return entry.actor.fn(entry.ctx.payload)


class Executor(Protocol):
    async def run(self, entry: Execution) -> Any:
        """Start the actor and wait for its result (the consumer awaits this). An actor stopped by the
        worker raises asyncio.CancelledError here."""

    def request_cancel(self, entry: Execution) -> None:
        """Phase 1: the cooperative signal is already on the context; forward it where it must travel."""

    def force_cancel(self, entry: Execution) -> None:
        """Phase 2: interrupt the actor (task.cancel / thread interrupt / SIGTERM of the child)."""

    def kill(self, entry: Execution) -> None:
        """After both graces: the last resort (nothing more for asyncio; a leaked thread; SIGKILL for a
        child)."""

    async def reap(self) -> None:
        """At worker exit: wait for what this executor started (threads, children)."""


class AsyncioExecutor:
    """Runs `async def` actors on the worker's loop, inside the consumer task itself."""

    async def run(self, entry: Execution) -> Any:
        return await call_actor(entry)

    def request_cancel(self, entry: Execution) -> None:
        pass

    def force_cancel(self, entry: Execution) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel(msg=f"taskq: forced stop ({entry.cancel_origin or entry.stop_cause})")

    def kill(self, entry: Execution) -> None:
        pass  # a task that swallows CancelledError cannot be stopped from outside; the row is abandoned

    async def reap(self) -> None:
        pass
