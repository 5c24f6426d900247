"""`@actor`: names, isolation defaults, type adapters, retry policy and the registry (no database)."""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from pydantic import BaseModel

from taskq.actors.declaration import Actor, ActorRegistry, RetryPolicy, actor, as_registry, default_registry
from taskq.context import JobContext
from taskq.exceptions import ActorDefinitionError, PayloadInvalid


class Image(BaseModel):
    url: str
    width: int


class Thumb(BaseModel):
    url: str


def crunch(payload: list[int], ctx: JobContext[list[int]]) -> int:
    """Module level, so it may run in a child process."""
    return sum(payload)


@pytest.fixture
def registry() -> ActorRegistry:
    return ActorRegistry()


def test_bare_decorator_on_async_def_declares_an_async_actor_named_module_dot_qualname(
    registry: ActorRegistry,
) -> None:
    async def resize(payload: Image, ctx: JobContext[Image]) -> Thumb:
        return Thumb(url=payload.url)

    declared = actor(registry=registry)(resize)
    assert isinstance(declared, Actor)
    assert declared.name == f"{resize.__module__}.{resize.__qualname__}"
    assert declared.name.endswith("<locals>.resize")
    assert declared.isolation == "async"
    assert declared.takes_context is True
    assert registry.get(declared.name) is declared


def test_bare_decorator_without_parentheses_registers_in_the_default_registry() -> None:
    async def bare_declared_actor(payload: int) -> int:
        return payload

    # the name is unique to this test, so leaving it in the process-wide registry is harmless
    declared = actor(bare_declared_actor)
    assert default_registry.get(declared.name) is declared
    assert declared.isolation == "async"
    assert declared.takes_context is False
    assert (declared.queue, declared.max_attempts, declared.priority) == ("default", 3, 0)


def test_plain_def_defaults_to_thread_isolation(registry: ActorRegistry) -> None:
    def build(payload: dict[str, int]) -> None:
        return None

    assert actor(registry=registry)(build).isolation == "thread"


def test_options_are_kept_on_the_declared_actor(registry: ActorRegistry) -> None:
    def cleanup(row: Any) -> None: ...
    def notify(row: Any) -> None: ...

    policy = RetryPolicy(base=0.5, factor=3.0, max_delay=20.0, jitter=0.0)

    @actor(
        name="reports.build",
        queue="reports",
        isolation="thread",
        max_attempts=5,
        retry=policy,
        timeout=30.0,
        schedule_to_close=600.0,
        priority=-7,
        on_cancel=cleanup,
        on_success=notify,
        on_cancel_timeout=1.5,
        registry=registry,
    )
    def build(payload: int, ctx: JobContext[int]) -> str:
        return str(payload)

    assert (build.name, build.queue, build.isolation, build.max_attempts) == (
        "reports.build",
        "reports",
        "thread",
        5,
    )
    assert (build.retry, build.timeout, build.schedule_to_close, build.priority) == (policy, 30.0, 600.0, -7)
    assert (build.on_cancel, build.on_success, build.on_retry_exhausted) == (cleanup, notify, None)
    assert build.on_cancel_timeout == 1.5
    assert build(3, None) == "3", "an Actor stays callable as the plain function"
    assert registry.names() == ["reports.build"]


def test_module_level_function_may_be_a_process_actor(registry: ActorRegistry) -> None:
    declared = actor(isolation="process", registry=registry)(crunch)
    assert declared.isolation == "process"
    assert declared.payload_adapter.validate_python(["1", 2]) == [1, 2]
    assert declared.result_adapter.validate_python("3") == 3


def test_process_actor_defined_in_a_local_function_is_rejected(registry: ActorRegistry) -> None:
    def local_crunch(payload: int) -> int:
        return payload

    with pytest.raises(ActorDefinitionError, match="module-level"):
        actor(isolation="process", registry=registry)(local_crunch)
    assert len(registry) == 0


async def _async_fn(payload: int) -> int:
    return payload


def _sync_fn(payload: int) -> int:
    return payload


@pytest.mark.parametrize(
    ("fn", "isolation", "message"),
    [
        (_sync_fn, "async", "needs an async def"),
        (_async_fn, "thread", "needs a plain def"),
        (_async_fn, "process", "needs a plain def"),
        (_sync_fn, "fiber", "isolation must be one of"),
    ],
    ids=["async-on-def", "thread-on-async-def", "process-on-async-def", "unknown-isolation"],
)
def test_invalid_isolation_for_the_function_kind_is_rejected(
    registry: ActorRegistry, fn: Any, isolation: Any, message: str
) -> None:
    with pytest.raises(ActorDefinitionError, match=message):
        actor(isolation=isolation, registry=registry)(fn)
    assert len(registry) == 0


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"priority": 2**40},
        {"timeout": float("nan")},
        {"queue": ""},
        {"name": ""},
        {"on_cancel": "not callable"},
    ],
    ids=[
        "max_attempts-0",
        "priority-too-big",
        "timeout-nan",
        "empty-queue",
        "empty-name",
        "hook-not-callable",
    ],
)
def test_invalid_options_are_rejected_at_declaration(registry: ActorRegistry, options: dict[str, Any]) -> None:
    with pytest.raises(ActorDefinitionError):
        actor(registry=registry, **options)(_sync_fn)


def test_signature_with_more_than_payload_and_context_is_rejected(registry: ActorRegistry) -> None:
    def three(payload: int, ctx: Any, extra: int) -> None: ...

    with pytest.raises(ActorDefinitionError, match="payload"):
        actor(registry=registry)(three)


def test_payload_and_result_adapters_come_from_the_annotations(registry: ActorRegistry) -> None:
    async def resize(payload: Image, ctx: JobContext[Image]) -> Thumb:
        return Thumb(url=payload.url)

    async def totals(payload: list[int]) -> dict[str, float]:
        return {}

    declared = actor(registry=registry)(resize)
    assert declared.validate_payload({"url": "u", "width": "12"}) == Image(url="u", width=12)
    assert declared.result_adapter.validate_python({"url": "t"}) == Thumb(url="t")
    with pytest.raises(PayloadInvalid, match="width"):
        declared.validate_payload({"url": "u", "width": "wide"})

    listed = actor(registry=registry)(totals)
    assert listed.validate_payload(["1", 2, 3.0]) == [1, 2, 3]
    assert listed.dump_payload([1, 2]) == b"[1,2]"
    with pytest.raises(PayloadInvalid, match=r"\b1: "):
        listed.validate_payload([1, "x"])


def test_unannotated_actor_accepts_any_payload_and_result(registry: ActorRegistry) -> None:
    async def loose(payload, ctx):  # type: ignore[no-untyped-def]
        return payload

    declared = actor(registry=registry)(loose)
    odd = {"nested": [1, "two", None, {"three": 3.0}]}
    assert declared.validate_payload(odd) == odd
    assert declared.result_adapter.validate_python(odd) == odd


def test_retry_delay_grows_exponentially_up_to_the_cap_without_jitter() -> None:
    policy = RetryPolicy(base=1.0, factor=2.0, max_delay=10.0, jitter=0.0)
    assert [policy.delay(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_retry_delay_stays_within_the_jitter_band_and_actually_varies() -> None:
    policy = RetryPolicy(base=2.0, factor=3.0, max_delay=100.0, jitter=0.25)
    for attempt, nominal in ((1, 2.0), (2, 6.0), (3, 18.0), (5, 100.0)):
        samples = [policy.delay(attempt) for _ in range(300)]
        assert min(samples) >= nominal * 0.75
        assert max(samples) <= nominal * 1.25
        assert statistics.pstdev(samples) > 0


@pytest.mark.parametrize(
    "options",
    [{"base": -1.0}, {"factor": 0.5}, {"jitter": 1.5}, {"max_delay": float("inf")}, {"base": float("nan")}],
)
def test_retry_policy_rejects_invalid_numbers(options: dict[str, float]) -> None:
    with pytest.raises(ActorDefinitionError):
        RetryPolicy(**options)


def test_reusing_a_name_for_a_different_function_is_rejected(registry: ActorRegistry) -> None:
    def first(payload: int) -> None: ...
    def second(payload: int) -> None: ...

    kept = actor(name="shared.name", registry=registry)(first)
    with pytest.raises(ActorDefinitionError, match="already used"):
        actor(name="shared.name", registry=registry)(second)
    assert registry["shared.name"] is kept


def test_redeclaring_the_same_function_replaces_the_entry(registry: ActorRegistry) -> None:
    actor(name="again", registry=registry)(_sync_fn)
    again = actor(name="again", registry=registry, max_attempts=9)(_sync_fn)
    assert registry["again"] is again


def test_decorating_an_actor_twice_is_rejected(registry: ActorRegistry) -> None:
    declared = actor(name="once", registry=registry)(_sync_fn)
    with pytest.raises(ActorDefinitionError, match="already an actor"):
        actor(registry=registry)(declared)


def test_as_registry_accepts_an_actor_a_list_or_a_dict_and_rejects_plain_functions(
    registry: ActorRegistry,
) -> None:
    a = actor(name="one", registry=registry)(_sync_fn)
    b = actor(name="two", registry=registry)(_async_fn)
    assert as_registry(registry) is registry
    assert as_registry(a).names() == ["one"]
    assert as_registry([a, b]).names() == ["one", "two"]
    assert as_registry({"x": b}).names() == ["two"]
    with pytest.raises(ActorDefinitionError, match="not an actor"):
        as_registry([a, _sync_fn])


def test_actor_limits_are_declared_and_checked_at_decoration_time() -> None:
    reg = ActorRegistry()

    async def job(payload: int) -> None:
        return None

    declared = actor(name="limits.ok", global_concurrency=3, concurrency_per_key=2, rate_limit=100,
                     rate_period=60, registry=reg)(job)
    assert declared.limits.describe() == "concurrency 3, 2 per key, 100 per 60s"
    assert actor(name="limits.none", registry=reg)(job).limits.any is False
    bad: list[dict[str, Any]] = [
        {"global_concurrency": 0}, {"global_concurrency": -1}, {"global_concurrency": True},
        {"global_concurrency": 2.5}, {"concurrency_per_key": 0}, {"rate_limit": 5},
        {"rate_period": 1.0}, {"rate_limit": 0, "rate_period": 1.0}, {"rate_limit": 5, "rate_period": 0},
        {"rate_limit": 5, "rate_period": float("nan")}, {"rate_limit": 5, "rate_period": float("inf")},
    ]
    for options in bad:
        with pytest.raises(ActorDefinitionError):
            actor(name="limits.bad", registry=reg, **options)(job)
    assert "limits.bad" not in reg
