"""The child side of process isolation: a warm process that runs one job at a time for its worker.

Started by `taskq.actors.process.ProcessExecutor` with multiprocessing's spawn context (a fresh
interpreter that inherits the worker's `sys.path`). At start the child

- moves into its own process group, so the worker's SIGTERM/SIGKILL reach whatever the actor starts;
- asks the kernel to SIGKILL it when its worker dies (`PR_SET_PDEATHSIG`), then checks that the worker
  did not die before that request (`getppid()`), so a child never outlives its worker;
- resets the signal mask, ignores SIGINT (the worker owns shutdown) and installs the SIGTERM handler.

The main thread runs the actor; a reader thread takes the worker's messages, so a cancel or a reply
arrives while the actor computes. SIGTERM raises `ActorInterrupted` inside the actor (deferred while a
message is being written, so the pipe never carries half a frame); outside a job it ends the child.

Wire format, both ways: a 4-byte big-endian length, then a pickled tuple whose first item names the
message. Payload and result travel as JSON encoded by the actor's TypeAdapters.

    worker -> child   ("run", key, spec)  ("cancel", key, origin)  ("reply", seq, value, error)
    child -> worker   ("ready", pid)  ("progress", key, seq, data, message)
                      ("enqueue", key, seq, target, payload, options)
                      ("result", key, result_json)  ("cancelled", key, forced)
                      ("error", key, pickled_exception | None, class_name, message, traceback, non_retryable)

`key` is (job_id, attempt, claim_epoch): every message names the attempt it belongs to.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import itertools
import logging
import os
import pickle
import queue
import signal
import socket
import struct
import threading
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID

from taskq import tracing
from taskq.actors.thread import ActorInterrupted
from taskq.models import CancelOrigin

if TYPE_CHECKING:
    from taskq.actors.declaration import Actor
    from taskq.client import JobHandle

P = TypeVar("P")

HEADER = struct.Struct("!I")
EXIT_PARENT_GONE = 75
"""Exit code of a child whose worker went away (channel closed, or reparented before PDEATHSIG)."""
PR_SET_PDEATHSIG = 1

JobKey = tuple[UUID, int, int]


def encode_frame(message: tuple[Any, ...]) -> bytes:
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(body)) + body


def pickle_exception(exc: BaseException) -> bytes | None:
    """The exception pickled, or None when it cannot be (the receiver then rebuilds it by name)."""
    try:
        return pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (AttributeError, OSError):
        pass  # not Linux: the closed channel still ends the child (see _Child.read_forever)
    if os.getppid() != parent_pid:  # the worker died before prctl: nobody would signal us
        os._exit(EXIT_PARENT_GONE)


class _Channel:
    """Blocking framed I/O on the child's end of the socketpair. Only the main thread writes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def send(self, message: tuple[Any, ...]) -> None:
        self.sock.sendall(encode_frame(message))

    def recv(self) -> tuple[Any, ...] | None:
        header = self._exactly(HEADER.size)
        if header is None:
            return None
        body = self._exactly(HEADER.unpack(header)[0])
        if body is None:
            return None
        message: tuple[Any, ...] = pickle.loads(body)
        return message

    def _exactly(self, n: int) -> bytes | None:
        chunks = bytearray()
        while len(chunks) < n:
            chunk = self.sock.recv(min(n - len(chunks), 1 << 20))
            if not chunk:
                return None
            chunks += chunk
        return bytes(chunks)


@dataclass(eq=False)
class _Job:
    key: JobKey
    spec: dict[str, Any]
    cancel_event: threading.Event = field(default_factory=threading.Event)
    origin: str | None = None

    def cancel(self, origin: str) -> None:
        if self.origin is None or origin == CancelOrigin.OPERATOR.value:
            self.origin = origin
        self.cancel_event.set()


@dataclass(eq=False)
class _Reply:
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None


class _Child:
    """The child's state. `state` is 'idle' (waiting for a job), 'busy' (taskq code around a job) or
    'actor' (inside the actor function): the SIGTERM handler acts on it."""

    def __init__(self, sock: socket.socket) -> None:
        self.channel = _Channel(sock)
        self.jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self.current: _Job | None = None
        self.replies: dict[int, _Reply] = {}
        self.seq = itertools.count(1)
        self.state = "idle"
        self.critical = 0
        self.interrupt_pending = False
        self.actors: dict[tuple[str, str, str], Actor[Any, Any]] = {}

    # -- signals -----------------------------------------------------------------------------------

    def on_sigterm(self, signum: int, frame: Any) -> None:
        if self.state == "idle":
            raise SystemExit(0)
        if self.state == "actor" and not self.critical:
            raise ActorInterrupted("taskq: forced cancel (SIGTERM from the worker)")
        self.interrupt_pending = True

    @contextlib.contextmanager
    def critical_section(self) -> Iterator[None]:
        """Defer SIGTERM's interrupt while a frame is written: half a frame would break the channel."""
        self.critical += 1
        try:
            yield
        finally:
            self.critical -= 1
            if not self.critical and self.interrupt_pending and self.state == "actor":
                self.interrupt_pending = False
                raise ActorInterrupted("taskq: forced cancel (SIGTERM from the worker)")

    # -- reader thread -----------------------------------------------------------------------------

    def read_forever(self) -> None:
        while True:
            try:
                message = self.channel.recv()
            except OSError:
                message = None
            if message is None:  # the worker closed the channel or died
                if self.current is None:
                    self.jobs.put(None)
                    return
                os._exit(EXIT_PARENT_GONE)
            kind = message[0]
            if kind == "run":
                job = _Job(key=message[1], spec=message[2])
                if job.spec.get("cancel_origin"):
                    job.cancel(job.spec["cancel_origin"])
                self.current = job
                self.jobs.put(job)
            elif kind == "cancel":
                current = self.current
                if current is not None and current.key == message[1]:
                    current.cancel(message[2])
            elif kind == "reply":
                reply = self.replies.get(message[1])
                if reply is not None:
                    reply.value = message[2]
                    reply.error = _unpickle_error(message[3])
                    reply.done.set()

    # -- main thread -------------------------------------------------------------------------------

    def serve(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            self.state = "busy"
            outcome = self._run_guarded(job)
            self.current = None  # before the outcome: the worker may send the next job at once
            self.channel.send(outcome)
            self.state = "idle"
            self.interrupt_pending = False

    def request(self, kind: str, job: _Job, *args: Any) -> Any:
        """Ask the worker to do something on its loop for this job, and wait for the answer."""
        seq = next(self.seq)
        reply = _Reply()
        self.replies[seq] = reply
        try:
            with self.critical_section():
                self.channel.send((kind, job.key, seq, *args))
            reply.done.wait()
        finally:
            self.replies.pop(seq, None)
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _run_guarded(self, job: _Job) -> tuple[Any, ...]:
        # a SIGTERM that lands on the way out of the actor is still the forced cancel of this job
        outcome: tuple[Any, ...] | None = None
        while True:
            try:
                if outcome is None:
                    outcome = self._run(job)
                self.state = "busy"
                return outcome
            except ActorInterrupted:
                self.state = "busy"
                if outcome is None:
                    outcome = ("cancelled", job.key, True)

    def _run(self, job: _Job) -> tuple[Any, ...]:
        signal.signal(signal.SIGTERM, self.on_sigterm)  # the previous actor may have replaced it
        spec = job.spec
        try:
            actor = self._load_actor(spec["module"], spec["qualname"], spec["actor"])
            payload = actor.validate_json_payload(spec["payload"])
            ctx: ChildJobContext[Any] = ChildJobContext(self, job, payload)
            self.state = "actor"
            try:
                if self.interrupt_pending:
                    raise ActorInterrupted("taskq: forced cancel before the actor started")
                with tracing.attached(spec.get("trace")):
                    result = actor.fn(payload, ctx) if actor.takes_context else actor.fn(payload)
            finally:
                self.state = "busy"
        except ActorInterrupted:
            return ("cancelled", job.key, True)
        except asyncio.CancelledError:
            return ("cancelled", job.key, False)
        except BaseException as exc:
            return _error_message(job.key, exc)
        try:
            raw = actor.result_adapter.dump_json(result)
        except Exception as exc:
            return ("error", job.key, None, "ResultInvalid",
                    f"actor {actor.name!r} returned a result that cannot be stored: {exc}", "", True)
        return ("result", job.key, raw)

    def _load_actor(self, module_name: str, qualname: str, name: str) -> Actor[Any, Any]:
        """The actor by module + qualname, else by its name among the module's actors."""
        from taskq.actors.declaration import Actor

        cache_key = (module_name, qualname, name)
        found = self.actors.get(cache_key)
        if found is not None:
            return found
        module = importlib.import_module(module_name)
        value: Any = module
        for part in qualname.split("."):
            value = getattr(value, part, None)
        if isinstance(value, Actor) and value.name == name:
            found = value
        else:
            found = next((v for v in vars(module).values() if isinstance(v, Actor) and v.name == name), None)
        if found is None:
            raise LookupError(f"no actor named {name!r} in module {module_name!r} (looked for {qualname})")
        self.actors[cache_key] = found
        return found


def _error_message(key: JobKey, exc: BaseException) -> tuple[Any, ...]:
    from taskq.exceptions import NonRetryableError, PayloadInvalid

    return (
        "error", key, pickle_exception(exc), type(exc).__name__, str(exc) or repr(exc),
        "".join(traceback.format_exception(exc)), isinstance(exc, NonRetryableError | PayloadInvalid),
    )


def _unpickle_error(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    try:
        error = pickle.loads(blob)
    except Exception as exc:
        return RuntimeError(f"the worker's error could not be unpickled: {exc}")
    return error if isinstance(error, BaseException) else RuntimeError(repr(error))


class _ChildJobs:
    """`ctx.jobs` inside a child: enqueue child jobs through the worker (parent_id is this job)."""

    def __init__(self, ctx: ChildJobContext[Any]) -> None:
        self._ctx = ctx

    def enqueue(self, target: Actor[Any, Any] | str, payload: Any, **options: Any) -> JobHandle[Any]:
        """Enqueue by actor or name; returns a handle without a client (as `ctx.jobs.enqueue` does)."""
        from taskq.actors.declaration import Actor
        from taskq.client import JobHandle

        if isinstance(target, Actor):
            payload = target.payload_adapter.dump_python(target.validate_payload(payload), mode="json")
            target = target.name
        if options.get("depends_on") is not None:  # ids cross the channel, not handles
            options["depends_on"] = [getattr(p, "job_id", p) for p in options["depends_on"]]
        row, created = self._ctx._child.request("enqueue", self._ctx._job, target, payload, options)
        return JobHandle(row.id, client=None, row=row, created=created)

    enqueue_sync = enqueue


class ChildJobContext(Generic[P]):
    """`ctx` of a process actor: the JobContext surface that makes sense in another process.

    `cancellation_requested` and `cancel_origin` follow the worker's phase-1 messages; `cancel_event`
    is a `threading.Event` (wait on it with a timeout); `progress()` is synchronous: it returns once the
    worker has persisted the checkpoint on the job row. `progress_sync` and `jobs.enqueue_sync` are
    aliases, so an actor written for thread isolation runs unchanged in a process."""

    def __init__(self, child: _Child, job: _Job, payload: P) -> None:
        spec = job.spec
        self._child = child
        self._job = job
        self.job_id: UUID = job.key[0]
        self.attempt: int = job.key[1]
        self.claim_epoch: int = job.key[2]
        self.payload = payload
        self.actor_name: str = spec["actor"]
        self.last_progress: Any = spec.get("last_progress")
        scheduled_for = spec.get("scheduled_for")
        self.scheduled_for: datetime | None = datetime.fromisoformat(scheduled_for) if scheduled_for else None
        self.cancel_event = job.cancel_event
        self.logger = logging.LoggerAdapter(
            logging.getLogger("taskq.job"), {"job_id": str(self.job_id), "attempt": self.attempt}
        )
        self.jobs = _ChildJobs(self)

    @property
    def cancellation_requested(self) -> bool:
        return self.cancel_event.is_set()

    @property
    def cancel_origin(self) -> CancelOrigin | None:
        origin = self._job.origin
        return CancelOrigin(origin) if origin is not None else None

    def progress(self, data: Any = None, *, message: str | None = None) -> None:
        """Persist a progress checkpoint (JSON-able `data` and/or a message) on the job row."""
        self._child.request("progress", self._job, data, message)
        self.last_progress = data

    progress_sync = progress

    def parent_results(self) -> dict[UUID, Any]:
        """{parent id: result} for the parents this job depends on (synchronous here; see
        JobContext.parent_results): typed by the parent's actor when the worker registers it."""
        results: dict[UUID, Any] = self._child.request("parent_results", self._job)
        return results

    parent_results_sync = parent_results

    # durable jobs: the step's function runs here, in the child; what is stored, and the sleeps and waits,
    # are the worker's (its JobContext does them on its loop, fenced by this attempt)

    def step(self, name: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        """As JobContext.step, synchronous: runs `fn` here once per job, its result stored by the worker."""
        from taskq.context import run_step_blocking

        return run_step_blocking(
            name, fn, args, kwargs,
            lookup=lambda: self._child.request("step_lookup", self._job, name),
            store=lambda raw: self._child.request("step_store", self._job, name, raw),
            run_async=asyncio.run,  # an async def step in a process actor: run it here
        )

    def sleep(self, duration: Any) -> None:
        """As JobContext.sleep: ends the attempt (raises JobSuspended) unless the sleep is over."""
        from taskq.context import _seconds

        self._child.request("sleep", self._job, _seconds(duration, "sleep duration"), None)

    def sleep_until(self, when: datetime) -> None:
        from taskq.exceptions import SleepInvalid

        if not isinstance(when, datetime) or when.tzinfo is None:
            raise SleepInvalid(f"sleep_until needs an aware datetime (with a tzinfo), got {when!r}")
        self._child.request("sleep", self._job, None, when)

    def wait_for_signal(self, name: str, timeout: Any = None) -> Any:
        """As JobContext.wait_for_signal: the payload, or the attempt ends waiting (JobSuspended)."""
        from taskq.context import _seconds
        from taskq.exceptions import StepInvalid
        from taskq.ops.durable import check_name

        check_name(name, "signal", StepInvalid)
        seconds = None if timeout is None else _seconds(timeout, "signal timeout")
        return self._child.request("wait", self._job, name, seconds)

    def transaction(self) -> Any:
        from taskq.exceptions import TransactionInvalid

        raise TransactionInvalid("ctx.transaction() is for async actors (the connection lives in the worker's "
                                 "event loop); write in a step instead from a process actor")


def child_main(sock: socket.socket, parent_pid: int, preload: Sequence[str], log_level: int,
               log_format: str = "text") -> None:
    """Entry point of a spawned child (the target of its multiprocessing.Process)."""
    os.setpgid(0, 0)
    _die_with_parent(parent_pid)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from taskq.logs import configure_logging

    configure_logging(log_format)  # the worker's format (text or JSON lines), at the worker's level
    logging.getLogger().setLevel(log_level)
    child = _Child(sock)
    signal.signal(signal.SIGTERM, child.on_sigterm)
    # spawned as a daemon (so multiprocessing's exit handler stops it), but an actor may use a Pool
    import multiprocessing.process

    multiprocessing.process.current_process()._config["daemon"] = False  # type: ignore[attr-defined]
    for module_name in preload:
        with contextlib.suppress(Exception):
            importlib.import_module(module_name)
    try:
        child.channel.send(("ready", os.getpid()))
    except OSError:  # the worker gave this child up while it started (it is stopping)
        return
    threading.Thread(target=child.read_forever, name="taskq-child-reader", daemon=True).start()
    child.serve()
