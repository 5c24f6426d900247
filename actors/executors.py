"""Executors run an actor's body and know how to stop it: the one seam between the worker's
cancellation ladder and the way an actor is isolated (asyncio task, thread, child process).

The consumer awaits `run()`; the ladder calls `request_cancel` at phase 1, `force_cancel` at phase 2
and `kill` once both graces are spent; the worker awaits `reap()` on its way out. Whatever the
isolation, an actor stopped by the worker surfaces from `run()` as `asyncio.CancelledError`, so the
consumer decides the outcome by the recorded cancel origin, never by the exception.

Thread isolation lives in `taskq.actors.thread`, process isolation in `taskq.actors.process` (imported
lazily: it is only needed by workers that run process actors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from taskq.actors.thread import ActorInterrupted, ThreadExecutor, call_actor, inject_exception

if TYPE_CHECKING:
    from taskq.worker.registry import ActiveJob

__all__ = [
    "ActorInterrupted",
    "AsyncioExecutor",
    "Executor",
    "ThreadExecutor",
    "call_actor",
    "inject_exception",
]


class Executor(Protocol):
    async def run(self, entry: ActiveJob) -> Any:
        """Start the actor and wait for its result (the consumer awaits this). An actor stopped by the
        worker raises asyncio.CancelledError here."""

    def request_cancel(self, entry: ActiveJob) -> None:
        """Phase 1: the cooperative signal is already on the context; forward it where it must travel."""

    def force_cancel(self, entry: ActiveJob) -> None:
        """Phase 2: interrupt the actor (task.cancel / thread interrupt / SIGTERM of the child)."""

    def kill(self, entry: ActiveJob) -> None:
        """After both graces: the last resort (nothing more for asyncio; a leaked thread; SIGKILL for a
        child)."""

    async def reap(self) -> None:
        """At worker exit: wait for what this executor started (threads, children)."""


class AsyncioExecutor:
    """Runs `async def` actors on the worker's loop, inside the consumer task itself."""

    async def run(self, entry: ActiveJob) -> Any:
        return await call_actor(entry)

    def request_cancel(self, entry: ActiveJob) -> None:
        pass

    def force_cancel(self, entry: ActiveJob) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel(msg=f"taskq: forced stop ({entry.cancel_origin or entry.stop_cause})")

    def kill(self, entry: ActiveJob) -> None:
        pass  # a task that swallows CancelledError cannot be stopped from outside; the row is abandoned

    async def reap(self) -> None:
        pass
