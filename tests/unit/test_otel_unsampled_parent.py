"""A job whose stored parent is not sampled, under a parent-based sampler that drops such a span (the
documented sampling set-up): the worker makes the span the SDK would make (a NonRecordingSpan of the
parent's trace, a new span id from the tracer's generator, flags 00) without calling the SDK, and calls
the SDK for everything else."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from opentelemetry import propagate, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    ParentBasedTraceIdRatio,
    Sampler,
    TraceIdRatioBased,
)

from taskq.contrib.otel import Tracing, Unrecorded, _drops_unsampled_parents

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
UNSAMPLED = json.dumps({"traceparent": f"00-{TRACE}-{SPAN}-00"})


@dataclass
class Job:
    trace_context: str | None
    attempt: int = 1
    id: uuid.UUID = field(default_factory=lambda: uuid.UUID(int=7))
    queue: str = "default"
    actor: str = "bench.noop"
    id_text: str | None = None


class Counting(IdGenerator):
    """Span ids 1, 2, 3...: the same sequence for the SDK's span and taskq's, so the two compare exactly."""

    def __init__(self) -> None:
        self.next = 0

    def generate_span_id(self) -> int:
        self.next += 1
        return self.next

    def generate_trace_id(self) -> int:
        return 0xABC


def provider(sampler: Sampler) -> tuple[TracerProvider, InMemorySpanExporter]:
    made = TracerProvider(sampler=sampler, id_generator=Counting())
    exporter = InMemorySpanExporter()
    made.add_span_processor(SimpleSpanProcessor(exporter))
    return made, exporter


def sdk_span(made: TracerProvider, stored: str) -> trace.Span:
    """What the SDK's tracer makes for this stored parent (what taskq made before its own path)."""
    parent = propagate.extract(json.loads(stored))
    return made.get_tracer("taskq").start_span("process default", context=parent, kind=trace.SpanKind.CONSUMER)


@pytest.mark.parametrize("sampler", [ParentBased(TraceIdRatioBased(0.1)), ParentBasedTraceIdRatio(0.1),
                                     ParentBased(ALWAYS_ON)], ids=["ratio", "ratio-class", "always-on"])
def test_an_unsampled_parent_gets_the_span_the_sdk_makes_without_the_sdk(sampler: Sampler) -> None:
    ours_provider, exporter = provider(sampler)
    theirs_provider, _ = provider(sampler)
    tracing = Tracing(ours_provider.get_tracer("taskq"))
    assert tracing._unsampled_span_id is not None
    expected = sdk_span(theirs_provider, UNSAMPLED)
    job = Job(UNSAMPLED)
    with tracing.consumer(job, "async") as outcome:
        span = outcome.span
        assert trace.get_current_span() is span  # current while the actor runs
        headers: dict[str, str] = {}
        propagate.inject(headers)  # what an enqueue inside the actor stores
        outcome.outcome("succeeded")
        assert outcome.traceparent() == f"00-{TRACE}-{1:016x}-00"  # what a retry's write would store
    assert isinstance(outcome, Unrecorded) and trace.get_current_span() is not span
    assert type(span) is type(expected) is trace.NonRecordingSpan
    assert span.get_span_context() == expected.get_span_context()
    assert span.get_span_context().span_id == 1 and not span.get_span_context().is_remote
    assert headers == {"traceparent": f"00-{TRACE}-{1:016x}-00"}
    assert exporter.get_finished_spans() == ()
    assert job.id_text is None  # no attributes made (the id's text is the first of them)


def test_the_fast_path_does_not_call_the_sampler_and_every_other_parent_does() -> None:
    sampler = ParentBased(TraceIdRatioBased(0.1))
    calls: list[str] = []
    original = sampler.should_sample

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2] if len(args) > 2 else kwargs.get("name", ""))
        return original(*args, **kwargs)

    made, exporter = provider(sampler)
    tracing = Tracing(made.get_tracer("taskq"))
    sampler.should_sample = counted  # type: ignore[method-assign]  # on the instance: the SDK calls it
    with tracing.consumer(Job(UNSAMPLED), "async"):
        pass
    assert calls == []
    for stored, attempt in [
        (json.dumps({"traceparent": f"00-{TRACE}-{SPAN}-01"}), 1),  # sampled
        (UNSAMPLED, 2),  # a later attempt: a root of its own, linked
        (json.dumps({"traceparent": f"00-{TRACE}-{SPAN}-00", "tracestate": "v=1"}), 1),
        (json.dumps({"traceparent": f"00-{'0' * 32}-{SPAN}-00"}), 1),  # invalid: no parent
        (json.dumps({"traceparent": f"00-{TRACE}-{'0' * 16}-00"}), 1),
        (json.dumps({"traceparent": f"00-{TRACE}-{SPAN}-02"}), 1),  # other flags
        (None, 1),
    ]:
        calls.clear()
        with tracing.consumer(Job(stored, attempt), "async"):
            pass
        assert calls, (stored, attempt)
    assert len(exporter.get_finished_spans()) >= 1  # the sampled parent's span was recorded


@pytest.mark.parametrize("sampler", [ALWAYS_ON, ALWAYS_OFF, TraceIdRatioBased(0.5),
                                     ParentBased(ALWAYS_ON, remote_parent_not_sampled=ALWAYS_ON)],
                         ids=["always-on", "always-off", "ratio", "records-unsampled-parents"])
def test_a_sampler_that_does_not_drop_such_a_span_by_itself_is_always_asked(sampler: Sampler) -> None:
    made, _ = provider(sampler)
    assert _drops_unsampled_parents(made.get_tracer("taskq")) is None
    tracing = Tracing(made.get_tracer("taskq"))
    theirs, _ = provider(sampler)
    with tracing.consumer(Job(UNSAMPLED), "async") as outcome:
        pass
    expected = sdk_span(theirs, UNSAMPLED)
    assert type(outcome.span) is type(expected)
    assert outcome.span.get_span_context().trace_flags == expected.get_span_context().trace_flags


def test_a_subclass_of_parent_based_that_decides_itself_is_asked() -> None:
    class Mine(ParentBased):
        def should_sample(self, *args: Any, **kwargs: Any) -> Any:
            return super().should_sample(*args, **kwargs)

    made, _ = provider(Mine(ALWAYS_ON))
    assert _drops_unsampled_parents(made.get_tracer("taskq")) is None


def test_a_tracer_the_sdk_turned_off_gets_the_sdks_span(monkeypatch: pytest.MonkeyPatch) -> None:
    made, _ = provider(ParentBased(ALWAYS_ON))
    tracer = made.get_tracer("taskq")
    tracing = Tracing(tracer)
    monkeypatch.setattr(tracer, "_is_enabled", lambda: False)
    tracing._enabled = tracer._is_enabled  # type: ignore[attr-defined]
    with tracing.consumer(Job(UNSAMPLED), "async") as outcome:
        pass
    # off, the SDK's tracer gives the parent's own span context back (remote, the parent's span id)
    assert outcome.span.get_span_context().span_id == int(SPAN, 16)


def test_the_sdks_metrics_about_its_spans_count_taskqs_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    made, _ = provider(ParentBased(ALWAYS_ON))
    assert _drops_unsampled_parents(made.get_tracer("taskq")) is None
