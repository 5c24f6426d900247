"""Thread isolation: plain `def` actors in dedicated threads, stopped by an injected exception.

The event loop never runs actor code: each job gets its own daemon thread (at most `max_threads` at
once) and the consumer awaits a future the thread settles. From the thread, `ctx.cancellation_requested`
reads a thread-safe flag and `ctx.progress_sync()` / `ctx.jobs.enqueue_sync()` are marshalled onto
the loop.

A forced cancel raises `ActorInterrupted` inside the actor thread with `PyThreadState_SetAsyncExc`, and
raises it again every `reinject_interval` seconds (an actor may catch it once) until the thread leaves
the actor or the ladder gives up on it. **The exception is delivered only when the thread next runs
Python bytecode: a thread blocked in a system call (`time.sleep`, a socket read, a lock) or inside a C
extension cannot be interrupted until that call returns.** A thread that never leaves is *leaked*: its
job is abandoned, its slot is never handed out again, it is counted in `leaked_threads`, and the
worker restarts itself once there are more than `max_leaked_threads`, because only the exit of the
process reclaims a stuck thread. Use process isolation for code that may block in C.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskq.actors.executors import call_actor
from taskq.exceptions import NonRetryableError, StandInError
from taskq.models import CancelOrigin

if TYPE_CHECKING:
    from taskq.actors.executors import Execution

log = logging.getLogger("taskq.executor.thread")


class ActorInterrupted(BaseException):
    """Raised inside an actor by a forced cancel: injected into an actor thread, or raised by the
    SIGTERM handler of a process actor's child. It derives from BaseException, outside the taskq error
    tree, so that a bare `except Exception` in the actor does not swallow it. Clean up in `finally`
    blocks and let it propagate; the worker records the attempt as force-cancelled. It lives here, not in
    taskq.exceptions, because it is this executor's mechanism rather than an error taskq reports (the
    child's handler raises the same class), and docs/isolation.md names it by this path."""


_stand_ins: dict[tuple[str, bool], type[StandInError]] = {}


def stand_in_error(name: str, message: str, *, non_retryable: bool = False,
                   remote_traceback: str = "") -> StandInError:
    """A StandInError whose class is named `name` (NonRetryableError too when `non_retryable`)."""
    cls = _stand_ins.get((name, non_retryable))
    if cls is None:
        bases: tuple[type, ...] = (StandInError, NonRetryableError) if non_retryable else (StandInError,)
        cls = type(name if name.isidentifier() else "StandInError", bases, {"__module__": __name__})
        _stand_ins[(name, non_retryable)] = cls
    exc = cls(message)
    exc.remote_traceback = remote_traceback
    return exc


def inject_exception(thread_id: int, exc_type: type[BaseException] | None) -> bool:
    """Raise `exc_type` asynchronously in the thread (None clears a pending one); True if exactly that
    thread was found. The thread only sees it when it next executes Python bytecode."""
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    target = ctypes.c_ulong(thread_id)
    changed = set_async_exc(target, ctypes.py_object(exc_type) if exc_type is not None else None)
    if changed > 1:  # more than one thread state touched: undo, as the C API asks
        set_async_exc(target, None)
        return False
    return bool(changed == 1)


@dataclass(eq=False)
class _ActorThread:
    """One job's thread. `in_actor` is written under `lock` by the thread and read under it by the
    loop, so an exception is only injected while the thread is inside the actor."""

    entry: Execution
    done: asyncio.Future[None]
    """Settled when the consumer may go on: the thread left the actor, or the ladder detached it."""
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the thread has left the actor for good."""
    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    in_actor: bool = False
    forced: bool = False
    leaked: bool = False
    """Given up on after a forced stop: counted in leaked_threads, no more injections."""
    detached: bool = False
    """Its job was terminalised by the ladder (abandoned): nothing waits for this thread any more."""
    left: bool = False
    outcome: tuple[bool, Any] | None = None
    timers: list[asyncio.TimerHandle] = field(default_factory=list)


class ThreadExecutor:
    """Runs plain `def` actors in dedicated threads (never on the loop), at most `max_threads` at once.

    While an actor thread executes, its job stays held: the consumer's outcome (a write or a release)
    waits for the thread to leave even if the consumer task is cancelled, so that no second execution
    can start beside a thread that is still running. Only the ladder's `kill()`, after the abandonment
    verdict is written, lets the consumer go without its thread.

    `cleanup_grace_period` bounds the re-injection after a forced stop that the ladder does not own
    (timeout, deadline, shutdown, lost lease); a thread still inside the actor then is counted as leaked
    and `on_leak_change(entry)` is called, as it is when a leaked thread finally leaves (the worker
    updates its gauge and decides whether to restart). The ladder reports its own abandonments."""

    def __init__(
        self,
        max_threads: int,
        *,
        reinject_interval: float = 0.05,
        cleanup_grace_period: float = 10.0,
        on_leak_change: Callable[[Execution], None] | None = None,
    ) -> None:
        self.max_threads = max_threads
        self.reinject_interval = reinject_interval
        self.cleanup_grace_period = cleanup_grace_period
        self.on_leak_change = on_leak_change
        self._slots = asyncio.Semaphore(max_threads)
        self._runs: dict[Execution, _ActorThread] = {}

    def configure(
        self, *, cleanup_grace_period: float, on_leak_change: Callable[[Execution], None] | None
    ) -> None:
        """Adopt the worker's settings (called by the worker before the first thread job)."""
        self.cleanup_grace_period = cleanup_grace_period
        self.on_leak_change = on_leak_change

    # -- Executor --------------------------------------------------------------------------------

    async def run(self, entry: Execution) -> Any:
        loop = asyncio.get_running_loop()
        run = _ActorThread(entry=entry, done=loop.create_future())
        self._runs[entry] = run
        try:
            await self._slots.acquire()
        except BaseException:
            self._runs.pop(entry, None)
            raise
        # from here the permit belongs to the thread: returned when it leaves, never while it is stuck
        # the actor runs in a copy of the consumer's context: its contextvars, and so the consumer's
        # OpenTelemetry span (taskq.tracing), are the actor's current ones
        thread = threading.Thread(target=contextvars.copy_context().run, args=(self._body, run, loop),
                                  name=f"taskq-actor-{entry.id}", daemon=True)
        run.thread = thread
        try:
            thread.start()
        except BaseException:
            self._runs.pop(entry, None)
            self._slots.release()
            raise
        await self._wait_for_thread(run)
        if run.outcome is None:  # detached by the ladder: the job is already abandoned
            raise asyncio.CancelledError("taskq: actor thread did not leave after a forced cancel")
        ok, value = run.outcome
        if ok:
            return value
        if isinstance(value, ActorInterrupted | asyncio.CancelledError):
            raise asyncio.CancelledError(f"taskq: actor thread stopped ({type(value).__name__})") from None
        if not isinstance(value, Exception):  # SystemExit, KeyboardInterrupt: fail the job, not the worker
            raise stand_in_error(type(value).__name__, str(value) or repr(value)) from value
        raise value

    def request_cancel(self, entry: Execution) -> None:
        pass  # the context's thread-safe flag is already set

    def force_cancel(self, entry: Execution) -> None:
        run = self._runs.get(entry)
        if run is None or run.left or run.forced:
            return
        run.forced = True
        if run.thread is None:
            # still waiting for a thread slot: stop waiting (the consumer decides by the cancel origin)
            if entry.task is not None and not entry.task.done():
                entry.task.cancel(msg="taskq: forced stop before the actor thread started")
            return
        self._inject(run)
        loop = asyncio.get_running_loop()
        run.timers.append(loop.call_later(self.reinject_interval, self._reinject, run))
        if entry.cancel_origin is not CancelOrigin.OPERATOR:
            run.timers.append(loop.call_later(self.cleanup_grace_period, self._give_up, run))

    def kill(self, entry: Execution) -> None:
        """After both graces, once the ladder has written the verdict: a thread still inside the actor is
        leaked and detached. Its consumer goes on; its slot stays taken until the thread leaves."""
        run = self._runs.get(entry)
        if run is None or run.left or run.thread is None:
            return
        self._give_up(run, report=False)
        run.detached = True
        if not run.done.done():
            run.done.set_result(None)

    def still_running(self, entry: Execution) -> bool:
        """True while the job's actor thread has not left the actor (its row must stay held)."""
        run = self._runs.get(entry)
        return run is not None and run.thread is not None and not run.left

    async def reap(self) -> None:
        """At worker exit: one last interrupt for every actor thread still running, then wait for the
        threads whose jobs are still held. This wait has no deadline of its own: the shutdown watchdog
        ends the process if a thread never leaves, and the sweeper reclaims its job. Detached threads
        (their jobs abandoned) are not waited for: the process exit ends them."""
        running = [r for r in self._runs.values() if not r.left and r.thread is not None]
        for run in running:
            run.forced = True
            self._inject(run)
        holding = [r for r in running if not r.detached]
        if holding:
            log.warning("waiting for %d actor thread(s) still executing (their jobs stay held): %s",
                        len(holding), [r.thread.name for r in holding if r.thread])
            await asyncio.gather(*(r.gone.wait() for r in holding))
        detached = [r.thread.name for r in running if r.detached and not r.left and r.thread]
        if detached:
            log.warning("%d leaked actor thread(s) left behind; the process exit ends them: %s",
                        len(detached), detached)

    # -- accounting ------------------------------------------------------------------------------

    @property
    def leaked_threads(self) -> int:
        """Threads given up on that are still inside their actor."""
        return sum(1 for r in self._runs.values() if r.leaked and not r.left)

    @property
    def live_threads(self) -> int:
        """Actor threads currently running (leaked ones included)."""
        return sum(1 for r in self._runs.values() if r.thread is not None and not r.left)

    # -- internals -------------------------------------------------------------------------------

    async def _wait_for_thread(self, run: _ActorThread) -> None:
        """Wait for the thread's outcome. A cancellation of the consumer (worker teardown) does not cut
        this wait short while the actor still executes: its job must stay held until the thread left."""
        while True:
            try:
                await asyncio.shield(run.done)
                return
            except asyncio.CancelledError:
                if run.done.done():
                    return
                log.warning("job %s: consumer cancelled while its actor thread still executes; the job "
                            "stays held until the thread leaves", run.entry.id)

    def _inject(self, run: _ActorThread) -> None:
        # never block the loop on the thread's lock: if the thread holds it, it is leaving the actor
        if not run.lock.acquire(blocking=False):
            return
        try:
            if run.in_actor and run.thread is not None and run.thread.ident is not None:
                if not inject_exception(run.thread.ident, ActorInterrupted):
                    log.warning("job %s: could not interrupt actor thread %s", run.entry.id, run.thread.name)
        finally:
            run.lock.release()

    def _reinject(self, run: _ActorThread) -> None:
        if run.left or run.leaked:
            return
        self._inject(run)
        run.timers.append(asyncio.get_running_loop().call_later(self.reinject_interval, self._reinject, run))

    def _give_up(self, run: _ActorThread, *, report: bool = True) -> None:
        if run.left or run.leaked or run.thread is None:
            return
        run.leaked = True
        for timer in run.timers:
            timer.cancel()
        log.error("job %s: actor thread %s did not leave the actor after a forced cancel; it is leaked "
                  "(blocked in a system call or C extension?) and its slot stays taken until it leaves or "
                  "the worker restarts", run.entry.id, run.thread.name)
        if report and self.on_leak_change is not None:
            self.on_leak_change(run.entry)

    def _body(self, run: _ActorThread, loop: asyncio.AbstractEventLoop) -> None:
        outcome: tuple[bool, Any] | None = None
        try:
            try:
                with run.lock:
                    interrupted = run.forced
                    run.in_actor = not interrupted
                if interrupted:
                    raise ActorInterrupted("taskq: forced cancel before the actor started")
                outcome = (True, call_actor(run.entry))
            except BaseException as exc:
                outcome = (False, exc)
            finally:
                with run.lock:
                    run.in_actor = False
                # an injection that raced the actor's return must not fire in the code below
                inject_exception(threading.get_ident(), None)
        except ActorInterrupted as late:  # delivered just after the actor returned
            if outcome is None:
                outcome = (False, late)
        while True:
            try:
                loop.call_soon_threadsafe(self._thread_left, run, outcome)
            except ActorInterrupted:
                continue  # a late injection landed in the call; at most one can be pending
            except RuntimeError:
                pass  # the loop is closed: the worker is gone and nobody waits for this thread
            break

    def _thread_left(self, run: _ActorThread, outcome: tuple[bool, Any] | None) -> None:
        if run.left:
            return
        run.left = True
        run.gone.set()
        for timer in run.timers:
            timer.cancel()
        self._slots.release()
        self._runs.pop(run.entry, None)
        if run.leaked:
            log.warning("job %s: leaked actor thread %s left the actor at last; its slot is free again",
                        run.entry.id, run.thread.name if run.thread else "?")
            if self.on_leak_change is not None:
                self.on_leak_change(run.entry)
        if not run.done.done():
            run.outcome = outcome
            run.done.set_result(None)
