"""OpenTelemetry for taskq (extra `taskq[otel]`: opentelemetry-api only; bring your own SDK and exporter).

Nothing to call: once the application has set a tracer provider (and imported OpenTelemetry, which
setting one does), taskq traces through `taskq.tracing`; once it has set a meter provider, the metric
names of the cancellation spec §10 are OpenTelemetry instruments too. TASKQ_OTEL=off turns both off.

Spans follow OpenTelemetry's messaging conventions (still "Development" status; schema pinned below):
- `send {queue}`, PRODUCER, at `enqueue` / `enqueue_many` (one span per call; a batch carries
  `messaging.batch.message_count`). Its W3C trace context (traceparent, tracestate) is stored on the job
  (column trace_context).
- `process {queue}`, CONSUMER, per attempt, in the worker. Attempt 1 is a child of the enqueue span (one
  trace from the producer's request through the job); a later attempt (a retry, or a run after a release
  or a crash) starts a trace of its own with a link to the enqueue's context, the parent of attempt 1, so
  a retry links to where the first attempt lives without making one endless trace. The span is current
  while the actor runs: async actors (in the consumer task), thread actors (the thread runs in a copy of
  the consumer's context) and process actors (the context travels to the child) all continue it.
  Attributes: messaging.system=taskq, messaging.operation.type/name, messaging.destination.name,
  messaging.message.id, taskq.actor, taskq.attempt, taskq.isolation, taskq.outcome, and error.type (the
  exception class or the cancel marker) when an attempt does not succeed.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any
from uuid import UUID

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
SYSTEM = "taskq"


class Outcome:
    """How one attempt ended, recorded on its consumer span."""

    __slots__ = ("span",)

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def outcome(self, name: str, error_type: str | None = None) -> None:
        self.span.set_attribute("taskq.outcome", name)
        if error_type is not None:
            self.span.set_attribute("error.type", error_type)
            self.span.set_status(Status(StatusCode.ERROR, error_type))


class Tracing:
    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer

    @contextlib.contextmanager
    def producer(self, queue: str, actor: str, job_id: UUID | None, count: int) -> Iterator[str | None]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "enqueue",
            "messaging.destination.name": queue, "taskq.actor": actor,
        }
        if job_id is not None and count == 1:
            attributes["messaging.message.id"] = str(job_id)
        else:
            attributes["messaging.batch.message_count"] = count
        with self.tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER, attributes=attributes):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            yield json.dumps(headers, separators=(",", ":")) if headers else None

    @contextlib.contextmanager
    def consumer(self, job: Any, isolation: str) -> Iterator[Outcome]:
        parent = context.Context()  # never the worker's own ambient context
        links: list[Link] = []
        stored = job.trace_context
        if stored:
            created = propagate.extract(stored)
            span_context = trace.get_current_span(created).get_span_context()
            if span_context.is_valid:
                if job.attempt <= 1:
                    parent = created
                else:
                    links.append(Link(span_context, {"taskq.link": "enqueue"}))
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.destination.name": job.queue, "messaging.message.id": str(job.id), "taskq.actor": job.actor,
            "taskq.attempt": job.attempt, "taskq.isolation": isolation,
        }
        span = self.tracer.start_span(f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER,
                                      attributes=attributes, links=links)
        token = context.attach(trace.set_span_in_context(span))
        try:
            yield Outcome(span)
        except BaseException as exc:
            span.record_exception(exc)
            raise
        finally:
            context.detach(token)
            span.end()

    def carrier(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        propagate.inject(headers)
        return headers

    def ids(self) -> dict[str, str]:
        span_context = trace.get_current_span().get_span_context()
        if not span_context.is_valid:
            return {}
        return {"trace_id": format(span_context.trace_id, "032x"), "span_id": format(span_context.span_id, "016x")}


_lock = threading.Lock()
_made: dict[str, tuple[object, Any]] = {}


def _for_provider(kind: str, provider: Any, make: Any) -> Any:
    """What `make(provider)` built for this global provider, built again when the provider changes; None
    while the API's placeholder (proxy or no-op: nothing configured) is the provider."""
    cached = _made.get(kind)
    if cached is not None and cached[0] is provider:
        return cached[1]
    if type(provider).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider",
                                   "NoOpMeterProvider"):
        return None
    with _lock:
        made = make(provider)
        _made[kind] = (provider, made)
    return made


def tracing() -> Tracing | None:
    """The Tracing for the current global tracer provider; None while none is set."""
    found: Tracing | None = _for_provider(
        "trace", trace.get_tracer_provider(), lambda p: Tracing(p.get_tracer("taskq", schema_url=SCHEMA_URL)))
    return found


# -- metrics (cancellation spec §10 names) ---------------------------------------------------------


class Instruments:
    def __init__(self, meter: metrics.Meter) -> None:
        self.requested = meter.create_counter("taskq.cancellation.requested", unit="{request}",
                                              description="JobsClient.cancel() calls")
        self.transitions = meter.create_counter("taskq.cancellation.phase_transitions", unit="{transition}",
                                                description="Cancellation ladder transitions in the worker")
        self.tick = meter.create_histogram("taskq.heartbeat.tick_duration_seconds", unit="s",
                                           description="Duration of one heartbeat transaction")
        self.failures = meter.create_gauge("taskq.heartbeat.consecutive_failures", unit="{tick}",
                                           description="Heartbeat ticks failed in a row")


def instruments() -> Instruments | None:
    """The spec §10 instruments on the current global meter provider; None while none is set."""
    found: Instruments | None = _for_provider(
        "metrics", metrics.get_meter_provider(),
        lambda p: Instruments(p.get_meter("taskq", schema_url=SCHEMA_URL)))
    return found
