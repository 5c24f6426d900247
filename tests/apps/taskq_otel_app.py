"""Actors for tests/integration/test_otel.py: each returns the trace id current while it runs (hex, or
"" when none), so the test can see the consumer span continued in async, thread and process actors."""

from __future__ import annotations

from taskq import JobContext, RetryPolicy, actor
from taskq.actors.declaration import ActorRegistry

registry = ActorRegistry()


def current_trace_id() -> str:
    try:
        from opentelemetry import trace
    except ImportError:
        return ""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


@actor(name="otel.async", queues=["*"], registry=registry)  # the traced body of every otel test, in any queue
async def in_async(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.thread", isolation="thread", registry=registry)
def in_thread(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.process", isolation="process", registry=registry)
def in_process(payload: int) -> str:
    return current_trace_id()


@actor(name="otel.flaky", max_attempts=3, retry=RetryPolicy(base=0.05, factor=1.0, jitter=0.0), registry=registry)
async def flaky(payload: int, ctx: JobContext[int]) -> str:
    if ctx.attempt < payload:
        raise RuntimeError(f"attempt {ctx.attempt} fails")
    return current_trace_id()


@actor(name="otel.parent_async", registry=registry)
async def parent_async(payload: int, ctx: JobContext[int]) -> str:
    await ctx.jobs.enqueue("otel.async", payload, queue="children")
    return current_trace_id()


@actor(name="otel.parent_thread", isolation="thread", registry=registry)
def parent_thread(payload: int, ctx: JobContext[int]) -> str:
    ctx.jobs.enqueue_sync("otel.async", payload, queue="children")
    return current_trace_id()
