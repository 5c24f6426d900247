"""`@actor`: declares a job handler, its payload/result types and its execution options."""

from __future__ import annotations

import inspect
import random
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from pydantic import TypeAdapter

from taskq.exceptions import ActorDefinitionError, NonRetryableError, PayloadInvalid, ScheduleDefinitionError
from taskq.models import QueueLimits
from taskq.patterns import matches_any, pattern_problem

if TYPE_CHECKING:
    from taskq.schedules import Schedule

Isolation = Literal["async", "thread", "process"]
ISOLATIONS: tuple[Isolation, ...] = ("async", "thread", "process")

P = TypeVar("P")
R = TypeVar("R")

Hook = Callable[..., Any]


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with a cap and jitter: delay(n) = min(cap, base * factor**(n-1)) ± jitter."""

    base: float = 1.0
    factor: float = 2.0
    max_delay: float = 300.0
    jitter: float = 0.1
    """Fraction of the delay drawn at random either way, so retries of a burst spread out."""

    def __post_init__(self) -> None:
        for name in ("base", "factor", "max_delay", "jitter"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value != value or value < 0 or value == float("inf"):
                raise ActorDefinitionError(f"RetryPolicy.{name} must be a finite number >= 0, got {value!r}")
        if self.factor < 1:
            raise ActorDefinitionError("RetryPolicy.factor must be >= 1")
        if self.jitter > 1:
            raise ActorDefinitionError("RetryPolicy.jitter must be between 0 and 1")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before the attempt after `attempt` (1-based) failed."""
        raw = min(self.max_delay, self.base * self.factor ** max(0, attempt - 1))
        if self.jitter:
            raw *= 1 + random.uniform(-self.jitter, self.jitter)
        return max(0.0, raw)


RetryKind = Literal["retry", "fail"]


def default_retry_kind(exc: BaseException) -> RetryKind:
    """Every exception is retryable except NonRetryableError and invalid payloads."""
    return "fail" if isinstance(exc, NonRetryableError | PayloadInvalid) else "retry"


@dataclass(frozen=True, eq=False)
class Actor(Generic[P, R]):
    """A declared job handler. Call `.fn` directly in tests; enqueue it with a JobsClient."""

    fn: Callable[..., Any]
    name: str
    queue: str
    isolation: Isolation
    max_attempts: int
    retry: RetryPolicy
    retry_kind: Callable[[BaseException], RetryKind]
    timeout: float | None
    schedule_to_close: float | None
    priority: int
    on_success: Hook | None
    on_cancel: Hook | None
    on_retry_exhausted: Hook | None
    on_cancel_timeout: float
    hook_timeout: float
    payload_adapter: TypeAdapter[P] = field(repr=False)
    result_adapter: TypeAdapter[R] = field(repr=False)
    takes_context: bool = True
    idempotent: bool = True
    """False: an attempt whose effect is unknown (its worker crashed or lost the lease, or a shutdown had
    to force it) is never re-run automatically; the job ends crashed for an operator to requeue."""
    global_concurrency: int | None = None
    """At most this many jobs of the actor running at once across the whole fleet."""
    concurrency_per_key: int | None = None
    """At most this many jobs of the actor running at once per `concurrency_key` (jobs without one are
    not limited by it)."""
    rate_limit: int | None = None
    """At most this many starts of the actor's jobs per `rate_period` seconds across the fleet."""
    rate_period: float | None = None
    queues: tuple[str, ...] = ()
    """The queue-name patterns (`*` for any run of characters) whose jobs the actor may run; empty means
    `(queue,)`, the declared queue only. A worker fails a job of the actor in any other queue
    (`ActorQueueMismatch`) without running it, and an enqueue that names one is refused."""

    def __post_init__(self) -> None:
        if not self.queues:
            object.__setattr__(self, "queues", (self.queue,))

    def allows_queue(self, queue: str) -> bool:
        """True when the actor may run a job in this queue (one of its `queues` patterns matches it). A name
        among the patterns matches itself, whatever it holds: the common case costs one tuple lookup."""
        return queue in self.queues or matches_any(self.queues, queue)

    @property
    def limits(self) -> QueueLimits:
        """The fleet-wide limits the actor declares (its workers write them to taskq.actor_limits)."""
        return QueueLimits(concurrency=self.global_concurrency, concurrency_per_key=self.concurrency_per_key,
                           rate_limit=self.rate_limit, rate_period=self.rate_period)

    def validate_payload(self, payload: Any) -> P:
        """The payload as the actor's type; raises PayloadInvalid naming the failing fields."""
        from pydantic import ValidationError

        try:
            return self.payload_adapter.validate_python(payload)
        except ValidationError as exc:
            raise PayloadInvalid(f"invalid payload for actor {self.name!r}: {_describe(exc)}") from None

    def validate_json_payload(self, raw: str | bytes) -> P:
        """Decode a payload read back from the database: its JSON text, as stored (what dump_payload wrote),
        validated in pydantic's JSON mode, the counterpart of that dump."""
        from pydantic import ValidationError

        try:
            return self.payload_adapter.validate_json(raw, strict=False)
        except ValidationError as exc:
            raise PayloadInvalid(f"stored payload no longer validates for {self.name!r}: {_describe(exc)}") from None

    def dump_payload(self, payload: Any) -> bytes:
        """Validate then encode as JSON bytes, exactly as stored."""
        value = self.validate_payload(payload)
        try:
            return self.payload_adapter.dump_json(value)
        except Exception as exc:
            raise PayloadInvalid(f"payload for actor {self.name!r} cannot be encoded as JSON: {exc}") from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


def _describe(exc: Any) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<payload>"
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


class ActorRegistry:
    """Actors (and the schedules that run them) by name. `@actor` registers into `default_registry`; a
    worker runs the registry it is given. `owner` names the application whose schedules these are: a
    worker disables the schedules of its owner that it no longer declares (default: the APP string)."""

    def __init__(self, actors: Iterable[Actor[Any, Any] | Schedule] = (), *, owner: str | None = None) -> None:
        self._by_name: dict[str, Actor[Any, Any]] = {}
        self._schedules: dict[str, Schedule] = {}
        self.owner = owner
        for a in actors:
            self.add(a)

    def add(self, item: Actor[Any, Any] | Schedule) -> None:
        """Register an actor, or a schedule (and the actor it runs)."""
        from taskq.schedules import Schedule

        if isinstance(item, Schedule):
            self.add_schedule(item)
        else:
            self.register(item)

    def add_schedule(self, schedule: Schedule) -> None:
        existing = self._schedules.get(schedule.name)
        if existing is not None and existing is not schedule:
            raise ScheduleDefinitionError(f"two schedules are named {schedule.name!r}")
        self.register(schedule.actor)
        self._schedules[schedule.name] = schedule

    def schedules(self) -> list[Schedule]:
        return [self._schedules[name] for name in sorted(self._schedules)]

    def register(self, a: Actor[Any, Any]) -> None:
        existing = self._by_name.get(a.name)
        if existing is not None and existing.fn is not a.fn:
            if (existing.fn.__module__, existing.fn.__qualname__) != (a.fn.__module__, a.fn.__qualname__):
                raise ActorDefinitionError(
                    f"actor name {a.name!r} is already used by {existing.fn.__module__}.{existing.fn.__qualname__}"
                )
        self._by_name[a.name] = a

    def get(self, name: str) -> Actor[Any, Any] | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> Actor[Any, Any]:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Actor[Any, Any]]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

    def names(self) -> list[str]:
        return sorted(self._by_name)


default_registry = ActorRegistry()


def _resolve_types(fn: Callable[..., Any]) -> tuple[Any, Any, bool]:
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or len(params) > 2 or any(
        p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params
    ):
        raise ActorDefinitionError(
            f"actor {fn.__qualname__} must take (payload) or (payload, ctx), got {sig}"
        )
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:
        raise ActorDefinitionError(f"cannot resolve the annotations of {fn.__qualname__}: {exc}") from None
    payload_type = hints.get(params[0].name, Any)
    result_type = hints.get("return", Any)
    return payload_type, result_type, len(params) == 2


def _check_hook(name: str, hook: Any) -> None:
    if hook is not None and not callable(hook):
        raise ActorDefinitionError(f"{name} must be callable, got {hook!r}")


def _check_seconds(name: str, value: float | None, *, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int | float) or value != value or value <= 0 or value == float("inf"):
        raise ActorDefinitionError(f"{name} must be a finite number of seconds > 0, got {value!r}")


def _check_limits(global_concurrency: Any, concurrency_per_key: Any, rate_limit: Any, rate_period: Any) -> None:
    for limit_name, value in (("global_concurrency", global_concurrency),
                              ("concurrency_per_key", concurrency_per_key), ("rate_limit", rate_limit)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < 2**31):
            raise ActorDefinitionError(f"{limit_name} must be a whole number between 1 and {2**31 - 1}, got {value!r}")
    if (rate_limit is None) != (rate_period is None):
        raise ActorDefinitionError("rate_limit and rate_period go together: N starts per rate_period seconds")
    if rate_period is not None:
        _check_seconds("rate_period", rate_period)


def _check_queues(queue: str, queues: Any) -> tuple[str, ...]:
    """The patterns an actor is bound to: `(queue,)` by default, else `queues` checked."""
    if queues is None:
        return (queue,)
    if isinstance(queues, str):
        raise ActorDefinitionError(
            f"queues must be a list of queue patterns, not one string: write queues=[{queues!r}]"
        )
    try:
        patterns = tuple(queues)
    except TypeError:
        raise ActorDefinitionError(
            f"queues must be a list of queue patterns (e.g. ['billing-*']), got {queues!r}"
        ) from None
    if not patterns:
        raise ActorDefinitionError("queues must name at least one queue pattern (['*'] allows every queue)")
    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem is not None:
            raise ActorDefinitionError(f"queues: {problem}")
    if not matches_any(patterns, queue):
        raise ActorDefinitionError(
            f"queue {queue!r} must match one of its queues= patterns ({list(patterns)!r}): the declared queue is "
            "where an enqueue puts the actor's jobs by default"
        )
    return patterns


@overload
def actor(fn: Callable[..., Any], /) -> Actor[Any, Any]: ...
@overload
def actor(
    *,
    name: str | None = ...,
    queue: str = ...,
    isolation: Isolation | None = ...,
    max_attempts: int = ...,
    retry: RetryPolicy | None = ...,
    retry_kind: Callable[[BaseException], RetryKind] | None = ...,
    timeout: float | None = ...,
    schedule_to_close: float | None = ...,
    priority: int = ...,
    on_success: Hook | None = ...,
    on_cancel: Hook | None = ...,
    on_retry_exhausted: Hook | None = ...,
    on_cancel_timeout: float = ...,
    hook_timeout: float = ...,
    idempotent: bool = ...,
    global_concurrency: int | None = ...,
    concurrency_per_key: int | None = ...,
    rate_limit: int | None = ...,
    rate_period: float | None = ...,
    queues: Sequence[str] | None = ...,
    registry: ActorRegistry | None = ...,
) -> Callable[[Callable[..., Any]], Actor[Any, Any]]: ...


def actor(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    queue: str = "default",
    isolation: Isolation | None = None,
    max_attempts: int = 3,
    retry: RetryPolicy | None = None,
    retry_kind: Callable[[BaseException], RetryKind] | None = None,
    timeout: float | None = None,
    schedule_to_close: float | None = None,
    priority: int = 0,
    on_success: Hook | None = None,
    on_cancel: Hook | None = None,
    on_retry_exhausted: Hook | None = None,
    on_cancel_timeout: float = 3.0,
    hook_timeout: float = 3.0,
    idempotent: bool = True,
    global_concurrency: int | None = None,
    concurrency_per_key: int | None = None,
    rate_limit: int | None = None,
    rate_period: float | None = None,
    queues: Sequence[str] | None = None,
    registry: ActorRegistry | None = None,
) -> Actor[Any, Any] | Callable[[Callable[..., Any]], Actor[Any, Any]]:
    """Declare a job handler. `async def` runs on the worker's event loop; a plain `def` runs in a
    thread unless `isolation="process"`. The first parameter's annotation is the payload type, the
    return annotation the result type (anything a pydantic TypeAdapter accepts).

    Fleet-wide limits (enforced in the claim, across every worker and host): `global_concurrency` jobs
    running at once, `concurrency_per_key` per `concurrency_key` given at enqueue, `rate_limit` starts
    per `rate_period` seconds. A job that waits for a limit spends no attempt.

    The actor runs only on the queues it is bound to: `queue` (where an enqueue puts its jobs by default)
    alone, unless `queues` lists the queue-name patterns it may run on (`*` stands for any run of
    characters; `queues=["*"]` allows every queue). `queue` must match one of them. A worker fails a job of
    the actor found in another queue (`ActorQueueMismatch`) without running it, and an enqueue that names
    another queue for it raises ConfigurationError."""

    def decorate(func: Callable[..., Any]) -> Actor[Any, Any]:
        if isinstance(func, Actor):
            raise ActorDefinitionError(f"{func.name!r} is already an actor")
        if not callable(func):
            raise ActorDefinitionError(f"@actor needs a function, got {func!r}")
        is_async = inspect.iscoroutinefunction(func)
        chosen: Isolation = isolation or ("async" if is_async else "thread")
        if chosen not in ISOLATIONS:
            raise ActorDefinitionError(f"isolation must be one of {ISOLATIONS}, got {chosen!r}")
        if chosen == "async" and not is_async:
            raise ActorDefinitionError(f"{func.__qualname__}: isolation='async' needs an async def")
        if chosen != "async" and is_async:
            raise ActorDefinitionError(f"{func.__qualname__}: isolation={chosen!r} needs a plain def")
        if chosen == "process" and ("<locals>" in func.__qualname__ or func.__module__ == "__main__"):
            raise ActorDefinitionError(
                f"{func.__qualname__}: a process actor must be a module-level function of an importable module"
            )
        actor_name = name if name is not None else f"{func.__module__}.{func.__qualname__}"
        if not isinstance(actor_name, str) or not actor_name or len(actor_name) > 255:
            raise ActorDefinitionError(f"actor name must be 1-255 characters, got {actor_name!r}")
        if not isinstance(queue, str) or not queue or len(queue) > 255:
            raise ActorDefinitionError(f"queue must be 1-255 characters, got {queue!r}")
        bound = _check_queues(queue, queues)
        if not isinstance(max_attempts, int) or isinstance(max_attempts, bool) or max_attempts < 1:
            raise ActorDefinitionError(f"max_attempts must be an int >= 1, got {max_attempts!r}")
        if not isinstance(priority, int) or isinstance(priority, bool) or not -(2**31) <= priority < 2**31:
            raise ActorDefinitionError(f"priority must be a 32-bit int, got {priority!r}")
        if not isinstance(idempotent, bool):
            raise ActorDefinitionError(f"idempotent must be True or False, got {idempotent!r}")
        _check_limits(global_concurrency, concurrency_per_key, rate_limit, rate_period)
        _check_seconds("timeout", timeout)
        _check_seconds("schedule_to_close", schedule_to_close)
        _check_seconds("on_cancel_timeout", on_cancel_timeout, allow_none=False)
        _check_seconds("hook_timeout", hook_timeout, allow_none=False)
        for hook_name, hook in (
            ("on_success", on_success), ("on_cancel", on_cancel), ("on_retry_exhausted", on_retry_exhausted)
        ):
            _check_hook(hook_name, hook)
        payload_type, result_type, takes_context = _resolve_types(func)
        try:
            payload_adapter: TypeAdapter[Any] = TypeAdapter(payload_type)
            result_adapter: TypeAdapter[Any] = TypeAdapter(result_type)
        except Exception as exc:
            raise ActorDefinitionError(f"{func.__qualname__}: unsupported payload/result type: {exc}") from None
        declared: Actor[Any, Any] = Actor(
            fn=func,
            name=actor_name,
            queue=queue,
            isolation=chosen,
            max_attempts=max_attempts,
            retry=retry or RetryPolicy(),
            retry_kind=retry_kind or default_retry_kind,
            timeout=timeout,
            schedule_to_close=schedule_to_close,
            priority=priority,
            on_success=on_success,
            on_cancel=on_cancel,
            on_retry_exhausted=on_retry_exhausted,
            on_cancel_timeout=float(on_cancel_timeout),
            hook_timeout=float(hook_timeout),
            payload_adapter=payload_adapter,
            result_adapter=result_adapter,
            takes_context=takes_context,
            idempotent=idempotent,
            global_concurrency=global_concurrency,
            concurrency_per_key=concurrency_per_key,
            rate_limit=rate_limit,
            rate_period=float(rate_period) if rate_period is not None else None,
            queues=bound,
        )
        (registry if registry is not None else default_registry).register(declared)
        return declared

    if fn is not None:
        return decorate(fn)
    return decorate


def as_registry(value: Any) -> ActorRegistry:
    """Accept a registry, a single actor or schedule, or an iterable mixing actors and schedules (what
    `taskq worker APP` names)."""
    from taskq.schedules import Schedule

    if isinstance(value, ActorRegistry):
        return value
    if isinstance(value, Actor | Schedule):
        return ActorRegistry([value])
    if isinstance(value, dict):
        value = value.values()
    try:
        items = list(value)
    except TypeError:
        raise ActorDefinitionError(
            f"expected actors and schedules, a list of them or an ActorRegistry, got {value!r}"
        ) from None
    bad = [item for item in items if not isinstance(item, Actor | Schedule)]
    if bad:
        raise ActorDefinitionError(f"not an actor (decorate it with @actor) nor a Schedule: {bad[0]!r}")
    return ActorRegistry(items)
