"""JobContext: what an actor sees of its job, its cancellation and its worker."""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import time
import typing
from collections.abc import Callable, Iterable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from uuid import UUID

from pydantic import TypeAdapter

from taskq.exceptions import (
    MAX_SNOOZE_SECONDS,
    SignalTimeout,
    SleepInvalid,
    StepInvalid,
    TransactionInvalid,
    duration_seconds,
)
from taskq.models import NO_TIMEOUT, CancelOrigin

if TYPE_CHECKING:
    from psycopg import AsyncConnection

    from taskq.actors.declaration import Actor
    from taskq.backend.durable import StoredStep, TakenSignal
    from taskq.client import JobHandle

__all__ = ["CancelOrigin", "ContextRuntime", "JobContext", "JobSuspended"]

STEP, SLEEP, SIGNAL = "step", "sleep", "signal"
"""The kinds of what an attempt stores (taskq.job_steps.kind)."""


class JobSuspended(BaseException):
    """`ctx.sleep()` or `ctx.wait_for_signal()` ended the attempt: the job is suspended (`kind` 'sleep' or
    'signal') until `until` (None: no timeout), and runs again from the top then. A BaseException, like
    asyncio.CancelledError, so that an actor's `except Exception` does not swallow it; the worker decides by
    what the context recorded, whatever the actor does with it on the way out."""

    def __init__(self, kind: str, until: datetime | None = None, signal: str | None = None) -> None:
        super().__init__(kind, until, signal)
        self.kind = kind
        self.until = until
        self.signal = signal

    def __str__(self) -> str:
        what = "sleeping" if self.kind == SLEEP else f"waiting for signal {self.signal!r}"
        return f"{what} until {self.until.isoformat() if self.until else 'it arrives'}"

    def __reduce__(self) -> tuple[Any, ...]:  # crosses the process-isolation boundary by pickle
        return (JobSuspended, (self.kind, self.until, self.signal))

P = TypeVar("P")


class ContextRuntime(Protocol):
    """What the worker provides behind a JobContext (persistence of progress, child enqueues)."""

    async def save_progress(self, ctx: JobContext[Any], data: Any, message: str | None) -> None: ...

    async def enqueue_child(
        self, ctx: JobContext[Any], target: Actor[Any, Any] | str, payload: Any, options: dict[str, Any]
    ) -> JobHandle[Any]: ...

    async def parent_results(self, ctx: JobContext[Any]) -> dict[UUID, Any]: ...

    async def load_steps(self, ctx: JobContext[Any]) -> list[StoredStep]: ...

    async def save_step(self, ctx: JobContext[Any], kind: str, name: str, *, result_json: str | None = None,
                        delay: float | None = None, wake_at: datetime | None = None
                        ) -> tuple[datetime | None, bool]: ...

    async def take_signal(self, ctx: JobContext[Any], name: str, wait: str) -> TakenSignal: ...

    async def signal_timeout(self, ctx: JobContext[Any], wait: str) -> None: ...

    def transaction(self, ctx: JobContext[Any]) -> AbstractAsyncContextManager[AsyncConnection[Any]]: ...


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

    Durable jobs (docs/durable.md): `step()` runs a function once per job and returns its stored result on
    every later attempt; `sleep()`, `sleep_until()` and `wait_for_signal()` suspend the job without holding
    a slot; `transaction()` commits the actor's writes and the job's success together.
    """

    # per-attempt state of the durable calls, made on first use (most jobs never make one)
    _stored: dict[tuple[str, str], StoredStep] | None = None
    _stored_at: float = 0.0
    _step_names: set[str] | None = None
    _sleeps: int = 0
    _waits: dict[str, int] | None = None
    suspension: JobSuspended | None = None
    """Set when a sleep or a wait suspended the attempt: the worker writes the suspension, whatever the actor
    did with the exception on its way out."""
    transaction_state: str | None = None
    """None; 'open' inside `async with ctx.transaction()`; 'held' after it (the job's row locked, the
    transaction waiting for the actor's return to commit its success); 'done'."""
    transaction_open: Any = None
    """The open transaction of `ctx.transaction()` (taskq.worker.transaction.OpenTransaction: its connection,
    and what ends it), from the block's start to the commit or rollback."""
    workflow_id: UUID | None = None
    """The workflow the job belongs to, read on its first `ctx.jobs.enqueue` (children inherit it)."""
    workflow_read: bool = False
    returned: bool = False
    """The actor has returned (set by the worker): the durable calls are refused from then on."""

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

    # -- durable jobs ----------------------------------------------------------------------------

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once for this job and store its result under `name`; on every later
        attempt (a retry, a release, a reclaim after a crash, a requeue) return the stored result without
        running it. `fn` may be plain or `async def`. Await it in an async actor; in a thread actor call it
        plainly (it returns the value). The result is stored as JSON through pydantic, typed by fn's return
        annotation when it has one, and returned as read back from that JSON, on the first run too.

        A step that raises stores nothing and runs again on the next attempt. A step an attempt that no
        longer holds the job tries to store is refused: LeaseLost, nothing stored. StepInvalid: a bad or
        repeated name, or a result that is not JSON."""
        if self._on_loop():
            return self._step_async(name, fn, args, kwargs)
        return self._step_blocking(name, fn, args, kwargs)

    def sleep(self, duration: timedelta | float) -> Any:
        """Sleep durably for `duration` (a timedelta or seconds): the attempt ends and frees its slot, and the
        job runs again from the top once the time has passed, its completed steps returning their stored
        results and this sleep returning at once. No attempt is spent. Await it in an async actor; call it
        plainly in a thread actor. SleepInvalid: negative, NaN, or over ten years."""
        delay = _seconds(duration, "sleep duration")
        return self._durable_call(self._sleep_async(delay, None))

    def sleep_until(self, when: datetime) -> Any:
        """`sleep()` until `when` (an aware datetime; a past one returns at once)."""
        if not isinstance(when, datetime) or when.tzinfo is None:
            raise SleepInvalid(f"sleep_until needs an aware datetime (with a tzinfo), got {when!r}")
        ahead = (when - datetime.now(UTC)).total_seconds()
        if ahead > MAX_SNOOZE_SECONDS:
            raise SleepInvalid(f"sleep_until {when.isoformat()} is more than ten years away")
        return self._durable_call(self._sleep_async(None, when))

    def wait_for_signal(self, name: str, timeout: timedelta | float | None = None) -> Any:
        """The payload of a signal `name` sent to this job (`client.signal`), taken once. With none there yet,
        the job is suspended like a sleep (no slot, no lease) until one arrives (then it is due at once and
        this call returns its payload on the rerun) or `timeout` passes (then this call raises SignalTimeout,
        on that run and on every later one). The n-th wait for a name in a run takes the n-th signal of that
        name; a signal sent before the wait is kept for it. Await it in an async actor."""
        from taskq.ops.durable import check_name

        check_name(name, "signal", StepInvalid)
        seconds = None if timeout is None else _seconds(timeout, "signal timeout")
        return self._durable_call(self._wait_async(name, seconds))

    def transaction(self) -> AbstractAsyncContextManager[AsyncConnection[Any]]:
        """`async with ctx.transaction() as conn:` a connection inside a transaction, for the actor's own
        writes to the job's database. The transaction does not commit at the end of the block: the block's
        end locks the job's row (checking this attempt still holds it: LeaseLost and a rollback otherwise),
        and the job's success, with its result, commits in this same transaction when the actor returns.
        If the actor raises instead, or is cancelled, nothing of it commits. One per attempt; async actors
        only (TransactionInvalid otherwise)."""
        if self.returned:
            raise TransactionInvalid("ctx.transaction() used after the actor returned")
        if not self._on_loop():
            raise TransactionInvalid("ctx.transaction() is for async actors (the connection lives in the worker's "
                                     "event loop); write in a step instead from a thread or process actor")
        return self._runtime.transaction(self)  # nested, or a second one: refused when it is entered

    def _on_loop(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def _durable_call(self, coro: Any) -> Any:
        """An async actor awaits the coroutine; a thread actor gets it run on the loop and waits."""
        if self._on_loop():
            return coro
        return self._call_on_loop(coro)

    def _check_open(self) -> None:
        if self.returned:
            raise StepInvalid("the actor has returned: durable calls are no longer possible for this attempt")

    def _claim_step_name(self, name: str) -> None:
        from taskq.ops.durable import check_name

        check_name(name, "step", StepInvalid)
        if self._step_names is None:
            self._step_names = set()
        if name in self._step_names:
            raise StepInvalid(f"step name {name!r} is used twice in one run of job {self.job_id}; "
                              "each step needs a name of its own")
        self._step_names.add(name)

    async def _lookup(self, kind: str, name: str) -> StoredStep | None:
        """What an earlier attempt stored under (kind, name). The first attempt has nothing stored (no query)."""
        if self._stored is None:
            stored = [] if self.attempt <= 1 else await self._runtime.load_steps(self)
            self._stored = {(s.kind, s.name): s for s in stored}
            self._stored_at = time.monotonic()
        return self._stored.get((kind, name))

    def _due(self, stored: StoredStep) -> bool:
        if stored.due:
            return True
        if stored.wake_at is None:
            return False
        return stored.wake_at <= datetime.now(UTC)

    async def _step_lookup(self, name: str) -> tuple[bool, Any]:
        """(found, stored result) for step `name`, after checking the name (a process actor's first half)."""
        self._check_open()
        self._claim_step_name(name)
        found = await self._lookup(STEP, name)
        return (True, found.result) if found is not None else (False, None)

    async def _step_store(self, name: str, raw: str) -> None:
        await self._runtime.save_step(self, STEP, name, result_json=raw)

    async def _step_async(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                          kwargs: dict[str, Any]) -> Any:
        if not callable(fn):
            raise StepInvalid(f"step {name!r}: {fn!r} is not callable")
        found, result = await self._step_lookup(name)
        adapter = return_adapter(fn)
        if found:
            return adapter.validate_python(result)
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        raw = dump_step_result(adapter, name, value)
        await self._step_store(name, raw)
        return adapter.validate_json(raw)

    def _step_blocking(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                       kwargs: dict[str, Any]) -> Any:
        return run_step_blocking(
            name, fn, args, kwargs,
            lookup=lambda: self._call_on_loop(self._step_lookup(name)),
            store=lambda raw: self._call_on_loop(self._step_store(name, raw)),
            run_async=self._call_on_loop,  # an async def step from a thread actor runs on the loop
        )

    def _suspend(self, kind: str, until: datetime | None, signal: str | None = None) -> JobSuspended:
        self.suspension = JobSuspended(kind, None if until is None or until >= NO_TIMEOUT else until, signal)
        return self.suspension

    async def _sleep_async(self, delay: float | None, when: datetime | None) -> None:
        self._check_open()
        self._sleeps += 1
        name = str(self._sleeps)
        found = await self._lookup(SLEEP, name)
        if found is not None:
            if self._due(found):
                return
            raise self._suspend(SLEEP, found.wake_at)
        if (delay is not None and delay <= 0) or (when is not None and when <= datetime.now(UTC)):
            return
        wake_at, due = await self._runtime.save_step(self, SLEEP, name, delay=delay, wake_at=when)
        if due:
            return
        raise self._suspend(SLEEP, wake_at)

    async def _wait_async(self, name: str, timeout: float | None) -> Any:
        self._check_open()
        if self._waits is None:
            self._waits = {}
        n = self._waits[name] = self._waits.get(name, 0) + 1
        wait = f"{name}#{n}"
        found = await self._lookup(SIGNAL, wait)
        if found is not None and isinstance(found.result, dict):
            if found.result.get("timeout"):
                raise SignalTimeout(f"no signal {name!r} arrived for job {self.job_id} before its timeout")
            return found.result.get("payload")
        taken = await self._runtime.take_signal(self, name, wait)
        if taken.signal_id is not None:
            return taken.payload
        if found is None:
            wake_at, due = await self._runtime.save_step(
                self, SIGNAL, wait, delay=math.inf if timeout is None else timeout)
        else:
            wake_at, due = found.wake_at, self._due(found)
        if due:
            await self._runtime.signal_timeout(self, wait)
            raise SignalTimeout(f"no signal {name!r} arrived for job {self.job_id} before its timeout")
        raise self._suspend(SIGNAL, wake_at, name)

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


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}
_ANY: TypeAdapter[Any] = TypeAdapter(Any)


def return_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    """The TypeAdapter of fn's return annotation (Any without one, or when it cannot be resolved); made once
    per function."""
    try:
        return _ADAPTERS[fn]
    except (KeyError, TypeError):
        pass
    try:
        hint = typing.get_type_hints(fn).get("return", Any)
    except Exception:
        hint = Any
    if hint is None:
        hint = type(None)
    adapter = _ANY if hint is Any else TypeAdapter(hint)
    try:
        if len(_ADAPTERS) > 4096:
            _ADAPTERS.clear()
        _ADAPTERS[fn] = adapter
    except TypeError:  # an unhashable callable
        pass
    return adapter


def run_step_blocking(name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], *,
                      lookup: Callable[[], tuple[bool, Any]], store: Callable[[str], Any],
                      run_async: Callable[[Any], Any]) -> Any:
    """A step from a thread or a process actor (JobContext.step's synchronous face): `lookup()` tells whether an
    earlier attempt stored it, and its result; otherwise fn runs here (an awaitable it returns goes to
    `run_async`) and `store(json)` writes the result, fenced, before it is returned as read back."""
    if not callable(fn):
        raise StepInvalid(f"step {name!r}: {fn!r} is not callable")
    found, result = lookup()
    adapter = return_adapter(fn)
    if found:
        return adapter.validate_python(result)
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):
        value = run_async(value)
    raw = dump_step_result(adapter, name, value)
    store(raw)
    return adapter.validate_json(raw)


def dump_step_result(adapter: TypeAdapter[Any], name: str, value: Any) -> str:
    """The step's result as JSON text; StepInvalid (nothing stored) when it cannot be."""
    try:
        raw = adapter.dump_json(value)
    except Exception as exc:
        raise StepInvalid(f"step {name!r} returned a result that cannot be stored as JSON: {exc}") from None
    if b"\\u0000" in raw:
        raise StepInvalid(f"step {name!r} returned a result with a NUL character, which PostgreSQL cannot store")
    return raw.decode("utf-8")


def _seconds(value: Any, what: str) -> float:
    """A duration in seconds: a timedelta or a number, finite, between 0 and ten years (SleepInvalid)."""
    return duration_seconds(value, what, SleepInvalid)
