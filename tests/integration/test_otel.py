"""OpenTelemetry (taskq.contrib.otel) with an in-memory exporter: the enqueue span and the process span in
one trace for async, thread and process actors (the trace continued inside the actor), each retry in a
trace of its own linked to the first attempt and the enqueue, jobs enqueued by actors and by schedules
traced too, and the spec §10 metric names as instruments."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from apps.taskq_otel_app import registry
from opentelemetry import context, metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from testkit import running_worker, wait_for

from taskq import JobsClient, Schedule, SyncJobsClient
from taskq.actors.declaration import ActorRegistry

EXPORTER = InMemorySpanExporter()
READER = InMemoryMetricReader()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The process-wide providers (OpenTelemetry allows setting each once per process), exporter cleared."""
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))
    EXPORTER.clear()
    yield EXPORTER
    EXPORTER.clear()


def _finished(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    found = [s for s in exporter.get_finished_spans() if s.name == name]
    return found if len(found) >= count else []


@pytest.mark.parametrize("actor", ["otel.async", "otel.thread", "otel.process"])
async def test_the_enqueue_and_process_spans_share_one_trace_continued_inside_the_actor(
    dsn: str, spans: InMemorySpanExporter, actor: str
) -> None:
    tracer = trace.get_tracer("test")
    async with await JobsClient.connect(dsn, registry=registry) as client:
        with tracer.start_as_current_span("request") as request:
            handle = await client.enqueue(actor, 1)
        async with running_worker(dsn, registry):
            row = await handle.wait(timeout=60)
        [process] = await wait_for(lambda: _finished(spans, "process default", 1), timeout=20)
    [send] = _finished(spans, "send default", 1)
    trace_id = request.get_span_context().trace_id
    assert send.kind is SpanKind.PRODUCER and send.context is not None and send.context.trace_id == trace_id
    assert send.attributes is not None and send.attributes["messaging.message.id"] == str(handle.job_id)
    assert process.kind is SpanKind.CONSUMER and process.context is not None
    assert process.context.trace_id == trace_id and process.parent is not None
    assert process.parent.span_id == send.context.span_id
    attributes: Any = process.attributes
    assert attributes["messaging.system"] == "taskq" and attributes["messaging.operation.type"] == "process"
    assert attributes["taskq.actor"] == actor and attributes["taskq.outcome"] == "succeeded"
    assert row.trace_context is not None and "traceparent" in row.trace_context
    assert row.result == format(trace_id, "032x"), "the actor did not run inside the process span"


UNSAMPLED_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736


def _unsampled_request() -> Any:
    """The context of a request whose caller did not sample its trace (flags 00): what a producer sampling
    at the root sees for nine requests in ten."""
    remote = trace.SpanContext(UNSAMPLED_TRACE, 0x00F067AA0BA902B7, is_remote=True, trace_flags=trace.TraceFlags(0))
    return trace.set_span_in_context(trace.NonRecordingSpan(remote))


@pytest.mark.parametrize("actor", ["otel.async", "otel.thread", "otel.process"])
async def test_an_unsampled_trace_runs_in_the_actor_and_records_no_span(
        dsn: str, spans: InMemorySpanExporter, actor: str) -> None:
    """The process span of a job whose enqueue was not sampled is the SDK's unrecorded span (the worker makes
    it itself: tests/unit/test_otel_unsampled_parent.py): the actor runs in the request's trace, a job it
    enqueues carries that trace unsampled, and nothing is exported."""
    import psycopg

    async def child() -> Any:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            cur = await conn.execute("SELECT trace_context->>'traceparent' FROM taskq.jobs"
                                     " WHERE queue = 'children' AND status = 'succeeded'")
            return await cur.fetchall()

    async with await JobsClient.connect(dsn, registry=registry) as client:
        token = context.attach(_unsampled_request())
        try:
            handle = await client.enqueue(actor, 1)
            parent = await client.enqueue("otel.parent_async", 1)
        finally:
            context.detach(token)
        sampled = await client.enqueue("otel.async", 2)  # no parent: sampled (ParentBased(ALWAYS_ON))
        async with running_worker(dsn, registry, queues=["default", "children"]):
            row = await handle.wait(timeout=60)
            await parent.wait(timeout=60)
            [(child_traceparent,)] = await wait_for(child, timeout=30)
            await sampled.wait(timeout=60)
            # the sampled job's span is exported when it ends: by then the others' would have been
            await wait_for(lambda: _finished(spans, "process default", 1), timeout=20)
    assert row.result == format(UNSAMPLED_TRACE, "032x"), "the actor did not run in the request's trace"
    assert row.trace_context is not None
    for traceparent in (row.trace_context["traceparent"], child_traceparent):
        assert isinstance(traceparent, str), traceparent
        assert traceparent.startswith(f"00-{UNSAMPLED_TRACE:032x}-") and traceparent.endswith("-00"), traceparent
    processed = [s for s in spans.get_finished_spans() if s.kind is SpanKind.CONSUMER]
    assert len(processed) == 1 and processed[0].context is not None
    assert processed[0].context.trace_id != UNSAMPLED_TRACE
    assert not [s for s in spans.get_finished_spans() if s.context and s.context.trace_id == UNSAMPLED_TRACE]


async def test_each_retry_runs_in_a_trace_of_its_own_linked_to_the_first_attempt_and_the_enqueue(
        dsn: str, spans: InMemorySpanExporter) -> None:
    async with await JobsClient.connect(dsn, registry=registry) as client:
        handle = await client.enqueue("otel.flaky", 3)  # attempts 1 and 2 fail, 3 succeeds
        async with running_worker(dsn, registry):
            row = await handle.wait(timeout=60)
        first, second, third = sorted(await wait_for(lambda: _finished(spans, "process default", 3), timeout=20),
                                      key=lambda s: s.start_time or 0)
    [send] = _finished(spans, "send default", 1)
    assert send.context is not None and first.context is not None
    assert first.context.trace_id == send.context.trace_id and first.parent is not None
    assert first.attributes is not None and first.attributes["error.type"] == "RuntimeError"
    for later in (second, third):
        assert later.context is not None and later.parent is None
        assert later.context.trace_id not in (send.context.trace_id, first.context.trace_id)
        links = {(link.attributes or {}).get("taskq.link"): link.context.span_id for link in later.links}
        assert links == {"first_attempt": first.context.span_id, "enqueue": send.context.span_id}, later.links
    assert third.context is not None and row.result == format(third.context.trace_id, "032x")
    assert row.trace_context is not None and "taskq_first_attempt" in row.trace_context


@pytest.mark.parametrize("actor", ["otel.parent_async", "otel.parent_thread"])
async def test_a_job_enqueued_by_an_actor_is_traced_from_the_enqueuing_attempt(
        dsn: str, spans: InMemorySpanExporter, actor: str) -> None:
    async with await JobsClient.connect(dsn, registry=registry) as client:
        handle = await client.enqueue(actor, 1)
        async with running_worker(dsn, registry, queues=["default", "children"]):
            await handle.wait(timeout=60)
            [child] = await wait_for(lambda: _finished(spans, "process children", 1), timeout=30)
    [parent] = _finished(spans, "process default", 1)
    [send_child] = _finished(spans, "send children", 1)
    assert parent.context is not None and send_child.context is not None and child.context is not None
    assert send_child.parent is not None and send_child.parent.span_id == parent.context.span_id
    assert child.parent is not None and child.parent.span_id == send_child.context.span_id
    assert child.context.trace_id == parent.context.trace_id


async def test_a_schedules_job_is_traced_from_its_fire(dsn: str, spans: InMemorySpanExporter) -> None:
    reg = ActorRegistry(owner="tests")
    target = registry.get("otel.async")
    assert target is not None
    reg.add(Schedule(name="traced", actor=target, every=timedelta(seconds=1), payload=1))
    async with running_worker(dsn, reg, schedule_poll_interval=0.2):
        [process] = await wait_for(lambda: _finished(spans, "process default", 1), timeout=30)
    sends = _finished(spans, "send default", 1)
    assert process.parent is not None and process.parent.span_id in {s.context.span_id for s in sends if s.context}
    send = next(s for s in sends if s.context and process.parent and s.context.span_id == process.parent.span_id)
    assert send.parent is None and send.attributes is not None and send.attributes["taskq.actor"] == "otel.async"


def test_the_sync_client_traces_enqueue_and_enqueue_many(dsn: str, spans: InMemorySpanExporter) -> None:
    with SyncJobsClient.connect(dsn) as client:
        client.enqueue("otel.async", 1, queue="sync")
        client.enqueue_many("otel.async", [1, 2, 3], queue="sync")
    one, batch = sorted(_finished(spans, "send sync", 2), key=lambda s: s.start_time or 0)
    assert one.attributes is not None and batch.attributes is not None
    assert batch.attributes["messaging.batch.message_count"] == 3


async def test_the_cancellation_spec_metric_names_are_opentelemetry_instruments(
    dsn: str, spans: InMemorySpanExporter
) -> None:
    async with await JobsClient.connect(dsn, registry=registry) as client:
        handle = await client.enqueue("otel.async", 1, queue="nobody")
        await client.cancel(handle.job_id)
        async with running_worker(dsn, registry, queues=["nobody"]):
            names = await wait_for(lambda: _metric_names() >= {"taskq.heartbeat.tick_duration_seconds",
                                                               "taskq.heartbeat.consecutive_failures"} and
                                   _metric_names(), timeout=20)
    assert "taskq.cancellation.requested" in names


def _metric_names() -> set[str]:
    data = READER.get_metrics_data()
    if data is None:
        return set()
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


async def test_the_claim_reads_a_stored_traceparent_by_the_text_fast_path(
        dsn: str, spans: InMemorySpanExporter) -> None:
    """The text the claim gets back for a trace context taskq wrote (jsonb's own spelling of it) is what
    taskq.contrib.otel matches without decoding the JSON; were the spelling to change, the slower path
    would still give the right parent, and only this test would notice."""
    import psycopg

    from taskq.contrib.otel import _stored_parent

    tracer = trace.get_tracer("test")
    async with await JobsClient.connect(dsn, registry=registry) as client:
        with tracer.start_as_current_span("request"):
            handle = await client.enqueue("otel.async", 1)
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute("SELECT trace_context::text FROM taskq.jobs WHERE id = %s", (handle.job_id,))
        [(text,)] = await cur.fetchall()
    _, parent, decoded = _stored_parent(text)
    assert decoded is None, f"the stored trace context {text!r} missed the fast path"
    [send] = _finished(spans, "send default", 1)
    assert send.context is not None and parent.span_id == send.context.span_id and parent.is_remote
