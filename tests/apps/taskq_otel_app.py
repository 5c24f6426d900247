"""Actors for tests/integration/test_otel.py: each returns the trace id current while it runs (hex, or
"" when none), so the test can see the consumer span continued in async, thread and process actors."""

from __future__ import annotations

from taskq import JobContext, actor
from taskq.actors.declaration import ActorRegistry

registry = ActorRegistry()


def current_trace_id() -> str:
    try:
        from opentelemetry import trace
    except ImportError:
        return ""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


@actor(name="otel.async", registry=registry)
async def in_async(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.thread", isolation="thread", registry=registry)
def in_thread(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.process", isolation="process", registry=registry)
def in_process(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.flaky", max_attempts=2, registry=registry)
async def flaky(payload: int, ctx: JobContext[int]) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails")
    return current_trace_id()
