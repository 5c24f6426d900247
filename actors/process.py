"""Process isolation: a pool of warm child processes, one job at a time each, stopped by signals.

Children are started with multiprocessing's **spawn** context: fork+exec of a fresh interpreter, never
a fork of the threaded worker, and the child inherits the worker's `sys.path`, so it imports the actor
(by module + qualname) exactly as the worker did. Children are started from the event loop's thread,
which lives as long as the worker: `PR_SET_PDEATHSIG` fires when the thread that created a child ends.
At most `max_children` exist at once; a child is reused until `max_tasks_per_child` jobs or until its
RSS (`/proc/<pid>/statm`, read after each job) exceeds `max_memory_per_child`.

The worker talks to a child over a socketpair with asyncio streams (the loop never blocks on child I/O);
the protocol is described in `taskq.actors.child`. The cancel ladder maps onto it as follows:

- phase 1 (`request_cancel`): a message sets the child's flag (`ctx.cancellation_requested`, `cancel_origin`);
- phase 2 (`force_cancel`): SIGTERM to the child's process group; the child raises `ActorInterrupted`
  inside the actor;
- `kill`, after both graces: SIGKILL to the group (the ladder has written the job abandoned).

Signals are sent by identity: only while the child still runs that job attempt and has not been reaped
(an unreaped pid cannot have been reused). A child that dies on its own (segfault, `os._exit`, the OOM
killer) fails the attempt with `ChildProcessDied` through the retry policy. Children die with their
worker (parent-death signal), `reap()` ends and waits for every child at worker exit, and every exit is
collected with waitpid: no orphans, no zombies.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import multiprocessing
import os
import pickle
import signal
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from taskq import tracing
from taskq.actors.child import HEADER, JobKey, child_main, encode_frame, pickle_exception
from taskq.actors.thread import stand_in_error
from taskq.context import JobSuspended
from taskq.exceptions import ChildProcessDied
from taskq.logs import current_log_format

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from taskq.actors.executors import Execution
    from taskq.settings import WorkerSettings

log = logging.getLogger("taskq.executor.process")

START_TIMEOUT = 60.0
"""Seconds a new child may take to import and report ready."""
DRAIN_AFTER_EXIT = 1.0
"""Seconds to keep reading a dead child's channel for what it sent before dying."""


def describe_exit(code: int) -> str:
    """'exit code 3' or 'killed by signal 11 (SIGSEGV)', from a multiprocessing exitcode."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by signal {-code} ({name})"
    return f"exit code {code}"


def _unexpected_exit(code: int) -> str:
    hint = "; the OOM killer sends SIGKILL" if code == -signal.SIGKILL else ""
    return describe_exit(code) + hint


def rss_bytes(pid: int) -> int:
    """Resident set size of a live process, from /proc/<pid>/statm (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(eq=False)
class _Child:
    proc: BaseProcess
    pid: int
    sock: socket.socket
    ready: asyncio.Future[None]
    exited: asyncio.Future[int]
    writer: asyncio.StreamWriter | None = None
    reader_task: asyncio.Task[None] | None = None
    watch_task: asyncio.Task[None] | None = None
    entry: Execution | None = None
    key: JobKey | None = None
    outcome: asyncio.Future[tuple[Any, ...]] | None = None
    signalled: int | None = None
    """The signal the worker sent for the current job (a death after it is the worker's doing)."""
    tasks_done: int = 0
    retiring: bool = False
    exitcode: int | None = None
    answers: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def busy(self) -> bool:
        return self.outcome is not None and not self.outcome.done()

    def send(self, message: tuple[Any, ...]) -> None:
        if self.writer is not None and not self.writer.is_closing():
            self.writer.write(encode_frame(message))

    def running(self, entry: Execution) -> bool:
        return self.entry is entry and self.key == (entry.id, entry.attempt, entry.claim_epoch) and self.busy


class ProcessExecutor:
    """Runs `isolation="process"` actors in warm child processes (see the module docstring)."""

    def __init__(self, settings: WorkerSettings, *, reap_timeout: float = 2.0) -> None:
        self.max_children = settings.max_children
        self.max_tasks_per_child = settings.max_tasks_per_child
        self.max_memory_per_child = settings.max_memory_per_child
        self.reap_timeout = reap_timeout
        self._mp = multiprocessing.get_context("spawn")
        self._live: set[_Child] = set()
        self._idle: list[_Child] = []
        self._by_entry: dict[Execution, _Child] = {}
        self._waiting: set[Execution] = set()
        self._spares: list[_Child] = []
        """Children started ahead of demand that are not ready yet; the next checkout takes one."""
        self._available = asyncio.Event()
        self._preload: set[str] = set()
        self._closing = False

    # -- Executor --------------------------------------------------------------------------------

    async def run(self, entry: Execution) -> Any:
        actor, ctx = entry.actor, entry.ctx
        assert actor is not None and ctx is not None
        self._waiting.add(entry)
        try:
            child = await self._checkout()
        finally:
            self._waiting.discard(entry)
        loop = asyncio.get_running_loop()
        key: JobKey = (entry.id, entry.attempt, entry.claim_epoch)
        child.entry, child.key, child.signalled = entry, key, None
        child.outcome = loop.create_future()
        self._by_entry[entry] = child
        module = actor.fn.__module__
        self._preload.add(module)
        origin = ctx.cancel_origin if ctx.cancellation_requested else None
        spec = {
            "module": module, "qualname": actor.fn.__qualname__, "actor": actor.name,
            "payload": actor.payload_adapter.dump_json(ctx.payload), "last_progress": ctx.last_progress,
            "cancel_origin": origin.value if origin is not None else None,
            "scheduled_for": ctx.scheduled_for.isoformat() if ctx.scheduled_for is not None else None,
            "trace": tracing.carrier(),  # the consumer span, continued in the child
        }
        try:
            child.send(("run", key, spec))
            outcome = await asyncio.shield(child.outcome)
        except asyncio.CancelledError:
            # the consumer itself is being torn down: nobody will take this child's answer. Its job must
            # stay held until the child is gone, or a second execution could start beside it.
            if child.busy:
                self._signal(child, entry, signal.SIGKILL)
                await _uncancellable(child.exited)
            self._retire(child)
            raise
        finally:
            self._by_entry.pop(entry, None)
            child.entry = child.key = None
        self._after_job(child, outcome)
        return self._result(actor, entry, child, outcome)

    def request_cancel(self, entry: Execution) -> None:
        child = self._by_entry.get(entry)
        if child is not None and child.running(entry) and entry.ctx is not None and entry.ctx.cancel_origin:
            child.send(("cancel", child.key, entry.ctx.cancel_origin.value))

    def force_cancel(self, entry: Execution) -> None:
        child = self._by_entry.get(entry)
        if child is not None:
            self._signal(child, entry, signal.SIGTERM)
        elif entry in self._waiting and entry.task is not None and not entry.task.done():
            entry.task.cancel(msg="taskq: forced stop before a child process took the job")

    def kill(self, entry: Execution) -> None:
        child = self._by_entry.get(entry)
        if child is not None:
            self._signal(child, entry, signal.SIGKILL)

    def still_running(self, entry: Execution) -> bool:
        """True while a child still runs the job (its row must stay held)."""
        child = self._by_entry.get(entry)
        return child is not None and child.running(entry)

    async def reap(self) -> None:
        """At worker exit: close every channel (a child exits on EOF), SIGKILL what is still there after
        `reap_timeout`, and wait for (waitpid) every child."""
        self._closing = True
        self._available.set()
        children = list(self._live)
        for child in children:
            child.retiring = True
            self._close_channel(child)
        if not children:
            return
        exits = [c.exited for c in children]
        _, pending = await asyncio.wait(exits, timeout=self.reap_timeout)
        for child in children:
            if not child.exited.done() and self._unreaped(child):
                log.warning("child %d did not exit on its own at worker exit; SIGKILL", child.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
        if pending:
            await asyncio.wait(pending, timeout=self.reap_timeout)
        for child in children:
            if child.watch_task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await asyncio.wait_for(child.watch_task, self.reap_timeout)

    # -- introspection ---------------------------------------------------------------------------

    @property
    def children(self) -> list[int]:
        """Pids of the live children (idle and busy)."""
        return sorted(c.pid for c in self._live)

    # -- pool ------------------------------------------------------------------------------------

    async def _checkout(self) -> _Child:
        while True:
            if self._closing:
                raise RuntimeError("the process executor is shut down")
            while self._idle:
                child = self._idle.pop()
                if not child.retiring and not child.exited.done():
                    return child
            if self._spares or len(self._live) < self.max_children:
                child = self._spares.pop(0) if self._spares else self._spawn()
                try:
                    await asyncio.wait_for(asyncio.shield(child.ready), START_TIMEOUT)
                except TimeoutError:
                    self._retire(child, kill=True)
                    raise ChildProcessDied(
                        f"child process {child.pid} did not start within {START_TIMEOUT:g} s"
                    ) from None
                except asyncio.CancelledError:
                    child.ready.add_done_callback(functools.partial(_release_when_ready, self, child))
                    raise
                return child
            self._available.clear()
            await self._available.wait()

    def _spawn(self) -> _Child:
        loop = asyncio.get_running_loop()
        parent_sock, child_sock = socket.socketpair()
        proc = self._mp.Process(
            target=child_main,
            args=(child_sock, os.getpid(), sorted(self._preload), logging.getLogger().getEffectiveLevel(),
                  current_log_format()),
            name="taskq-child", daemon=True,
        )
        try:
            proc.start()  # fork+exec from the loop thread (PDEATHSIG is bound to the creating thread)
        except BaseException:
            parent_sock.close()
            raise
        finally:
            child_sock.close()
        assert proc.pid is not None
        child = _Child(proc=proc, pid=proc.pid, sock=parent_sock, ready=loop.create_future(),
                       exited=loop.create_future())
        child.ready.add_done_callback(_retrieve)
        self._live.add(child)
        child.reader_task = loop.create_task(self._read(child), name=f"taskq-child-{child.pid}-reader")
        child.watch_task = loop.create_task(self._watch(child), name=f"taskq-child-{child.pid}-watch")
        log.debug("started child process %d", child.pid)
        return child

    def _release(self, child: _Child) -> None:
        """A child that finished its job (or was started for a job that went away) is idle again."""
        if child.ready.cancelled() or child.ready.exception() is not None:
            return
        if child.retiring or self._closing or child.exited.done():
            self._retire(child)
            return
        self._idle.append(child)
        self._available.set()

    def _retire(self, child: _Child, *, kill: bool = False) -> None:
        child.retiring = True
        if child in self._idle:
            self._idle.remove(child)
        if kill and self._unreaped(child):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
        self._close_channel(child)

    def _close_channel(self, child: _Child) -> None:
        if child.writer is not None:
            child.writer.close()
        else:
            child.sock.close()

    def _after_job(self, child: _Child, outcome: tuple[Any, ...]) -> None:
        child.tasks_done += 1
        if outcome[0] == "died":
            return
        reason = None
        if child.signalled is not None:
            reason = "it was signalled to stop its job"
        elif self.max_tasks_per_child and child.tasks_done >= self.max_tasks_per_child:
            reason = f"it ran {child.tasks_done} jobs (max_tasks_per_child)"
        elif self.max_memory_per_child:
            rss = rss_bytes(child.pid)
            if rss > self.max_memory_per_child:
                reason = f"its RSS is {rss} bytes (max_memory_per_child {self.max_memory_per_child})"
        if reason is None:
            self._release(child)
        else:
            log.info("recycling child process %d: %s", child.pid, reason)
            self._retire(child)

    def _signal(self, child: _Child, entry: Execution, sig: int) -> None:
        """Kill by identity: only the child still running this attempt, and only if not yet reaped."""
        if not child.running(entry) or not self._unreaped(child):
            return
        try:
            os.killpg(child.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        child.signalled = sig
        log.info("job %s attempt %d: sent %s to child process group %d", entry.id, entry.attempt,
                 signal.Signals(sig).name, child.pid)

    def _unreaped(self, child: _Child) -> bool:
        """True while the child's pid is still ours: it has not been waited for (polling it reaps it if
        it has just exited, so a pid we signal can never belong to another process)."""
        if child.exitcode is not None:
            return False
        try:
            return child.proc.exitcode is None
        except ValueError:  # the Process object was closed: long gone
            return False

    # -- channel ---------------------------------------------------------------------------------

    async def _read(self, child: _Child) -> None:
        try:
            reader, writer = await asyncio.open_unix_connection(sock=child.sock)
            child.writer = writer
            if child.retiring:
                writer.close()
            while True:
                header = await reader.readexactly(HEADER.size)
                body = await reader.readexactly(HEADER.unpack(header)[0])
                self._dispatch(child, pickle.loads(body))
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass  # the child closed its end (it exited)
        except Exception:
            log.exception("child process %d: protocol error; killing it", child.pid)
            self._retire(child, kill=True)

    def _dispatch(self, child: _Child, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "ready":
            if not child.ready.done():
                child.ready.set_result(None)
            return
        if message[1] != child.key or child.entry is None:
            return  # an answer for an attempt this child no longer runs
        if kind in ("result", "error", "cancelled"):
            if child.outcome is not None and not child.outcome.done():
                child.outcome.set_result(message)
        elif kind in ("progress", "enqueue", "parent_results", "step_lookup", "step_store", "sleep", "wait"):
            task = asyncio.get_running_loop().create_task(self._answer(child, child.entry, message))
            child.answers.add(task)
            task.add_done_callback(child.answers.discard)

    async def _answer(self, child: _Child, entry: Execution, message: tuple[Any, ...]) -> None:
        """Do what the child asked on the loop, with the real JobContext, and reply."""
        kind, key, seq, *args = message
        assert entry.ctx is not None
        value: Any = None
        error: bytes | None = None
        try:
            if kind == "progress":
                data, text = args
                await entry.ctx.progress(data, message=text)
            elif kind == "parent_results":
                value = await entry.ctx.parent_results()
            elif kind == "step_lookup":
                value = await entry.ctx._step_lookup(args[0])
            elif kind == "step_store":
                await entry.ctx._step_store(args[0], args[1])
            elif kind == "sleep":
                await entry.ctx._sleep_async(args[0], args[1])
            elif kind == "wait":
                value = await entry.ctx._wait_async(args[0], args[1])
            else:
                target, payload, options = args
                handle = await entry.ctx.jobs.enqueue(target, payload, **options)
                value = (handle.row, handle.created)
        except (Exception, JobSuspended) as exc:  # a sleep or a wait ends the attempt: the child raises it too
            error = pickle_exception(exc) or pickle_exception(RuntimeError(f"{type(exc).__name__}: {exc}"))
        if child.key == key:
            child.send(("reply", seq, value, error))

    async def _watch(self, child: _Child) -> None:
        """Wait for the child's exit without blocking the loop, collect its status (waitpid), then settle
        whatever it was doing."""
        code = await self._wait_exit(child)
        child.exitcode = code
        with contextlib.suppress(ValueError):
            child.proc.close()
        if child.reader_task is not None:
            try:  # let the reader take what the child sent before it died
                await asyncio.wait_for(asyncio.shield(child.reader_task), DRAIN_AFTER_EXIT)
            except TimeoutError:
                child.reader_task.cancel()
        self._close_channel(child)
        self._live.discard(child)
        for pool in (self._idle, self._spares):
            if child in pool:
                pool.remove(child)
        if not child.ready.done():
            child.ready.set_exception(ChildProcessDied(
                f"child process {child.pid} {describe_exit(code)} before it was ready"
            ))
        if child.outcome is not None and not child.outcome.done():
            child.outcome.set_result(("died", child.key, code))
        if child.retiring or child.signalled is not None:
            log.debug("child process %d %s", child.pid, describe_exit(code))
        else:
            log.warning("child process %d %s", child.pid, _unexpected_exit(code))
        child.exited.set_result(code)
        self._available.set()
        if child.retiring and child.tasks_done and not self._closing and not self._idle:
            self._warm_spare()

    def _warm_spare(self) -> None:
        """Replace a recycled child at once, so the next job does not wait for an interpreter to start."""
        if len(self._live) >= self.max_children:
            return
        try:
            spare = self._spawn()
        except Exception as exc:
            log.warning("could not start a spare child process: %s", exc)
            return
        self._spares.append(spare)
        spare.ready.add_done_callback(functools.partial(_release_spare, self, spare))

    async def _wait_exit(self, child: _Child) -> int:
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(child.pid)
        except (AttributeError, OSError):
            pidfd = None
        if pidfd is not None:
            gone: asyncio.Future[None] = loop.create_future()

            def exited() -> None:
                if not gone.done():
                    gone.set_result(None)

            loop.add_reader(pidfd, exited)
            try:
                await gone
            finally:
                loop.remove_reader(pidfd)
                os.close(pidfd)
        while True:  # after pidfd: at once; without it (old kernels): a cheap poll
            code = child.proc.exitcode
            if code is not None:
                return code
            await asyncio.sleep(0.02)

    # -- outcomes --------------------------------------------------------------------------------

    def _result(self, actor: Any, entry: Execution, child: _Child, outcome: tuple[Any, ...]) -> Any:
        kind = outcome[0]
        if kind == "result":
            raw: bytes = outcome[2]
            try:
                return actor.result_adapter.validate_json(raw)
            except Exception:
                return json.loads(raw)
        if kind == "cancelled":
            how = "interrupted by SIGTERM" if outcome[2] else "raised CancelledError"
            raise asyncio.CancelledError(f"taskq: process actor {how}")
        if kind == "error":
            _, _, blob, name, message, remote_tb, non_retryable = outcome
            exc: Any = None
            if blob is not None:
                with contextlib.suppress(Exception):
                    exc = pickle.loads(blob)
            # not picklable, or a BaseException (SystemExit...) that would stop the worker itself
            if not isinstance(exc, Exception):
                exc = stand_in_error(name, message, non_retryable=non_retryable, remote_traceback=remote_tb)
            if remote_tb:
                exc.add_note(f"raised in child process {child.pid}:\n{remote_tb}")
            raise exc
        code = outcome[2]
        if child.signalled is not None:
            # the worker stopped it (phase 2, kill, or its own teardown): the origin decides the verdict
            raise asyncio.CancelledError(f"taskq: child process {describe_exit(code)}")
        raise ChildProcessDied(
            f"child process {child.pid} running job {entry.id} attempt {entry.attempt} "
            f"{_unexpected_exit(code)}"
        )


def _release_when_ready(executor: ProcessExecutor, child: _Child, ready: asyncio.Future[None]) -> None:
    executor._release(child)


async def _uncancellable(future: asyncio.Future[Any]) -> None:
    """Wait for `future` even if the waiting task is cancelled meanwhile (the cancel is not lost: the
    caller re-raises its own CancelledError afterwards)."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(future)


def _release_spare(executor: ProcessExecutor, child: _Child, ready: asyncio.Future[None]) -> None:
    if child in executor._spares:  # nobody took it while it started
        executor._spares.remove(child)
        executor._release(child)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
