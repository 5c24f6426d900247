"""Executors run an actor's body and know how to stop it: the one seam between the worker's
cancellation ladder and the way an actor is isolated (asyncio task, thread, child process)."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from taskq.worker.registry import ActiveJob

log = logging.getLogger("taskq.executor")


class ActorInterrupted(BaseException):  # noqa: N818 - deliberately outside the Exception tree
    """Injected into an actor thread by a forced cancel. Derives from BaseException so that a bare
    `except Exception` in the actor does not swallow it."""


class Executor(Protocol):
    async def run(self, entry: ActiveJob) -> Any:
        """Start the actor and wait for its result (the consumer awaits this)."""

    def request_cancel(self, entry: ActiveJob) -> None:
        """Phase 1: the cooperative signal is already on the context; forward it where it must travel."""

    def force_cancel(self, entry: ActiveJob) -> None:
        """Phase 2: interrupt the actor (task.cancel / thread interrupt / SIGTERM of the child)."""

    def kill(self, entry: ActiveJob) -> None:
        """After both graces: the last resort (nothing more for asyncio; SIGKILL for a child)."""

    async def reap(self) -> None:
        """At worker exit: wait for what this executor started (threads, children)."""


def _call_actor(entry: ActiveJob) -> Any:
    assert entry.actor is not None and entry.ctx is not None
    if entry.actor.takes_context:
        return entry.actor.fn(entry.ctx.payload, entry.ctx)
    return entry.actor.fn(entry.ctx.payload)


class AsyncioExecutor:
    """Runs `async def` actors on the worker's loop, inside the consumer task itself."""

    async def run(self, entry: ActiveJob) -> Any:
        return await _call_actor(entry)

    def request_cancel(self, entry: ActiveJob) -> None:
        pass

    def force_cancel(self, entry: ActiveJob) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.cancel(msg=f"taskq: forced stop ({entry.cancel_origin or entry.stop_cause})")

    def kill(self, entry: ActiveJob) -> None:
        pass  # a task that swallows CancelledError cannot be stopped from outside; the row is abandoned

    async def reap(self) -> None:
        pass


def inject_exception(thread_id: int, exc_type: type[BaseException]) -> bool:
    """Raise `exc_type` asynchronously in the thread; True if the thread exists. A thread blocked in a
    system call or C extension only sees it when it returns to Python bytecode."""
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    changed = set_async_exc(ctypes.c_ulong(thread_id), ctypes.py_object(exc_type))
    if changed > 1:  # more than one thread state touched: undo, as the C API asks
        set_async_exc(ctypes.c_ulong(thread_id), None)
        return False
    return changed == 1


class ThreadExecutor:
    """Runs plain `def` actors in dedicated threads (never on the loop), at most `max_threads` at once."""

    def __init__(self, max_threads: int) -> None:
        self._slots = asyncio.Semaphore(max_threads)
        self._threads: dict[int, threading.Thread] = {}

    async def run(self, entry: ActiveJob) -> Any:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def body() -> None:
            try:
                result = _call_actor(entry)
            except BaseException as exc:  # includes ActorInterrupted
                loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                loop.call_soon_threadsafe(_settle, future, result, None)

        async with self._slots:
            thread = threading.Thread(target=body, name=f"taskq-actor-{entry.id}", daemon=True)
            thread.start()
            assert thread.ident is not None
            self._threads[thread.ident] = thread
            entry.thread_ident = thread.ident  # type: ignore[attr-defined]
            try:
                return await asyncio.shield(future)
            except ActorInterrupted:
                raise asyncio.CancelledError("taskq: actor thread interrupted") from None
            finally:
                if future.done():
                    self._threads.pop(thread.ident, None)

    def request_cancel(self, entry: ActiveJob) -> None:
        pass  # the context's thread-safe flag is already set

    def force_cancel(self, entry: ActiveJob) -> None:
        ident = getattr(entry, "thread_ident", None)
        if ident is not None and ident in self._threads:
            inject_exception(ident, ActorInterrupted)

    def kill(self, entry: ActiveJob) -> None:
        self.force_cancel(entry)

    @property
    def live_threads(self) -> int:
        return sum(1 for t in self._threads.values() if t.is_alive())

    async def reap(self) -> None:
        pass


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
