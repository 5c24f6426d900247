"""OpenTelemetry for taskq (extra `taskq[otel]`: opentelemetry-api only; bring your own SDK and exporter).

Nothing to call: once the application has set a tracer provider (and imported OpenTelemetry, which
setting one does), taskq traces through `taskq.tracing`; once it has set a meter provider, the metric
names of the cancellation spec §10 are OpenTelemetry instruments too. TASKQ_OTEL=off turns both off.
(taskq.tracing loads this module when it first finds OpenTelemetry imported; importing it registers
`tracing` and `instruments` below as taskq.tracing's hooks.)

Spans follow OpenTelemetry's messaging conventions (still "Development" status; schema pinned below):
- `send {queue}`, PRODUCER, at `enqueue` / `enqueue_many` (one span per call; a batch carries
  `messaging.batch.message_count`). Its W3C trace context (traceparent, tracestate) is stored on the job
  (column trace_context).
- `process {queue}`, CONSUMER, per attempt, in the worker. Attempt 1 is a child of the enqueue span (one
  trace from the producer's request through the job); a later attempt (a retry, or a run after a release
  or a crash) starts a trace of its own, without making one endless trace, linked to the first attempt's
  span (`taskq.link=first_attempt`: a retry's write stores it on the job, under trace_context's key
  `taskq_first_attempt`) and to the enqueue (`taskq.link=enqueue`). A run after a crash or a release of
  the first attempt has only the enqueue link: nothing wrote the first attempt's span down. The span is current
  while the actor runs: async actors (in the consumer task), thread actors (the thread runs in a copy of
  the consumer's context) and process actors (the context travels to the child) all continue it.
  Attributes: messaging.system=taskq, messaging.operation.type/name, messaging.destination.name,
  messaging.message.id, taskq.actor, taskq.attempt, taskq.isolation, taskq.outcome, and error.type (the
  exception class or the cancel marker) when an attempt does not succeed.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from taskq.tracing import FIRST_ATTEMPT, Hooks, id_text, register

SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
SYSTEM = "taskq"
_ROOT = context.Context()
_ENQUEUE_LINK = {"taskq.link": "enqueue"}
_FIRST_LINK = {"taskq.link": "first_attempt"}


_W3C = TraceContextTextMapPropagator()
_W3C_KEYS = frozenset({"traceparent", FIRST_ATTEMPT})
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


class Outcome:
    """The consumer span of one attempt, current while the actor runs (entered once per job: a class with
    slots, not a generator), and how the attempt ended, recorded on it."""

    __slots__ = ("span", "token")

    def __init__(self, span: trace.Span) -> None:
        self.span = span
        self.token: object = None

    def __enter__(self) -> Outcome:
        self.token = context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            self.span.record_exception(exc)
        context.detach(self.token)  # type: ignore[arg-type]
        self.span.end()

    def outcome(self, name: str, error_type: str | None = None) -> None:
        if error_type is None:
            self.span.set_attribute("taskq.outcome", name)
            return
        self.span.set_attributes({"taskq.outcome": name, "error.type": error_type})
        self.span.set_status(Status(StatusCode.ERROR, error_type))

    def traceparent(self) -> str | None:
        """This attempt's span as a W3C traceparent, for the later attempts to link to."""
        sc = self.span.get_span_context()
        return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{int(sc.trace_flags):02x}" if sc.is_valid else None


class Unrecorded(Outcome):
    """The consumer span of an attempt whose trace is not sampled (a NonRecordingSpan), current while the
    actor runs: an Outcome without the calls a span that records nothing ignores."""

    __slots__ = ()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        context.detach(self.token)  # type: ignore[arg-type]

    def outcome(self, name: str, error_type: str | None = None) -> None:
        pass


_STORED_W3C = re.compile(r'\{"traceparent": "00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})"\}')
"""A stored trace context that is one W3C traceparent and nothing else, as jsonb writes it back."""
_FLAGS = {"00": TraceFlags(0), "01": TraceFlags(1)}
_NONE = (_ROOT, INVALID_SPAN_CONTEXT, None)
_STORED_UNSAMPLED = re.compile(r'\{"traceparent": "00-(?!0{32})([0-9a-f]{32})-(?!0{16})[0-9a-f]{16}-00"\}')
"""The same, of a valid parent whose sampled flag is off (flags 00): its trace id."""


def _drops_unsampled_parents(tracer: trace.Tracer) -> Callable[[], int] | None:
    """The tracer's span-id generator when the tracer is the SDK's and would make a remote parent not
    sampled a NonRecordingSpan of the parent's trace, with a new span id and flags 00, calling no span
    processor whatever the span's attributes: its sampler is the SDK's ParentBased with the default for
    that parent (drop: `parentbased_traceidratio` and `parentbased_always_on` are such) and the SDK's
    metrics about its own spans are off (their default). None for anything else: a sampler of the
    application's, one that records such a span, or an SDK whose tracer is not what this reads."""
    sdk = sys.modules.get("opentelemetry.sdk.trace")
    sampling = sys.modules.get("opentelemetry.sdk.trace.sampling")
    if sdk is None or sampling is None or type(tracer) is not sdk.Tracer:
        return None
    sampler = getattr(tracer, "sampler", None)
    if (not isinstance(sampler, sampling.ParentBased)
            or type(sampler).should_sample is not sampling.ParentBased.should_sample
            or getattr(sampler, "_remote_parent_not_sampled", None) is not sampling.ALWAYS_OFF):
        return None
    own_metrics = getattr(tracer, "_tracer_metrics", None)  # counts every span started, dropped or not
    if own_metrics is not None and type(own_metrics).__name__ != "NoOpTracerMetrics":
        return None
    generator = getattr(tracer, "id_generator", None)
    generate: Callable[[], int] | None = getattr(generator, "generate_span_id", None)
    return generate


def _remote(trace_hex: str, span_hex: str, flags: str) -> tuple[context.Context, SpanContext]:
    """A remote parent's span context from a traceparent's fields (lowercase hex, checked by the caller),
    and a context holding it; INVALID_SPAN_CONTEXT for an all-zero id."""
    trace_id, span_id = int(trace_hex, 16), int(span_hex, 16)
    if not (trace_id and span_id):
        return _ROOT, INVALID_SPAN_CONTEXT
    span_context = SpanContext(trace_id, span_id, True, _FLAGS.get(flags) or TraceFlags(int(flags, 16)))
    return trace.set_span_in_context(NonRecordingSpan(span_context), _ROOT), span_context


_last_parent: tuple[str, tuple[context.Context, SpanContext, None]] = ("\0", _NONE)  # no stored text has a NUL
"""The last stored trace context read by the fast path, and what it gave: the jobs of one enqueue_many call
carry the same one (one producer span a call), and a worker claims and starts them one after another. What it
gives is immutable (a Context, a SpanContext), so one job's parent can be another's."""


def _stored_parent(stored: str) -> tuple[context.Context, SpanContext, dict[str, Any] | None]:
    """The enqueue's span context from a job's stored trace context (its JSON text, as claimed), a context
    holding it, and the stored object (None when read by the fast path: a traceparent and nothing else).
    What taskq's own inject writes with W3C propagation (the default: a version-00 traceparent) is matched
    on the text directly, without decoding the JSON, and read with the W3C propagator's checks; anything
    else is decoded: a traceparent beside a retry's first-attempt key is read the same way, and a
    tracestate, baggage, B3 or a propagator of the application's by the global propagator."""
    global _last_parent
    last = _last_parent
    if last[0] == stored:
        return last[1]
    found = _STORED_W3C.fullmatch(stored)
    if found is not None:
        parent = (*_remote(*found.groups()), None)
        _last_parent = (stored, parent)
        return parent
    headers = json.loads(stored)
    if not isinstance(headers, dict):
        return _NONE
    header = headers.get("traceparent")
    parts = _TRACEPARENT.fullmatch(header) if isinstance(header, str) and headers.keys() <= _W3C_KEYS else None
    if parts is not None:
        return (*_remote(*parts.groups()), headers)
    created = propagate.extract(headers)
    return created, trace.get_current_span(created).get_span_context(), headers


class Tracing:
    def __init__(self, tracer: trace.Tracer) -> None:
        self.tracer = tracer
        self._unsampled_span_id = _drops_unsampled_parents(tracer)
        """Set when the tracer drops the span of a remote parent not sampled: `consumer` then makes that
        span itself, as the SDK would, without the sampler's call, the attributes or the parent's Context
        (most jobs of a sampled set-up carry such a parent)."""
        self._enabled: Callable[[], bool] | None = getattr(tracer, "_is_enabled", None)
        """The SDK's switch for this tracer (its configurator may turn it off): off, the SDK's span differs."""

    @contextlib.contextmanager
    def producer(self, queue: str, actor: str, job_id: UUID | None, count: int,
                 parent: Outcome | None = None) -> Iterator[str | None]:
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "send", "messaging.operation.name": "enqueue",
            "messaging.destination.name": queue, "taskq.actor": actor,
        }
        if job_id is not None and count == 1:
            attributes["messaging.message.id"] = str(job_id)
        else:
            attributes["messaging.batch.message_count"] = count
        # `parent`: the consumer span of the attempt that enqueues (ctx.jobs.enqueue), whatever thread or
        # task the enqueue runs in; else the caller's current span
        within = trace.set_span_in_context(parent.span) if parent is not None else None
        with self.tracer.start_as_current_span(f"send {queue}", context=within, kind=SpanKind.PRODUCER,
                                               attributes=attributes):
            headers: dict[str, str] = {}
            propagate.inject(headers)
            yield json.dumps(headers, separators=(",", ":")) if headers else None

    def consumer(self, job: Any, isolation: str) -> Outcome:
        parent = _ROOT  # never the worker's own ambient context
        links: list[Link] | None = None
        stored = job.trace_context
        if stored:
            new_span_id = self._unsampled_span_id
            if new_span_id is not None and job.attempt <= 1 and (self._enabled is None or self._enabled()):
                unsampled = _STORED_UNSAMPLED.fullmatch(stored)
                if unsampled is not None:  # the span the SDK would make, without its sampler or attributes
                    return Unrecorded(NonRecordingSpan(SpanContext(int(unsampled[1], 16), new_span_id(), False,
                                                                   _FLAGS["00"])))
            created, span_context, headers = _stored_parent(stored)
            if span_context.is_valid:
                if job.attempt <= 1:
                    parent = created
                else:
                    # a later attempt starts a trace of its own, linked to the first attempt (stored by the
                    # retry's write) and to the enqueue
                    links = [Link(span_context, _ENQUEUE_LINK)]
            first = headers.get(FIRST_ATTEMPT) if headers is not None and job.attempt > 1 else None
            if isinstance(first, str):
                first_context = trace.get_current_span(_W3C.extract({"traceparent": first})).get_span_context()
                if first_context.is_valid:
                    links = [Link(first_context, _FIRST_LINK), *(links or ())]
        attributes: dict[str, Any] = {
            "messaging.system": SYSTEM, "messaging.operation.type": "process", "messaging.operation.name": "process",
            "messaging.destination.name": job.queue, "messaging.message.id": id_text(job), "taskq.actor": job.actor,
            "taskq.attempt": job.attempt, "taskq.isolation": isolation,
        }
        return Outcome(self.tracer.start_span(f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER,
                                              attributes=attributes, links=links))

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


def _make_tracing(provider: Any) -> Tracing:
    return Tracing(provider.get_tracer("taskq", schema_url=SCHEMA_URL))


def tracing() -> Tracing | None:
    """The Tracing for the current global tracer provider; None while none is set (called per traced place:
    a cache hit is one dictionary lookup and an identity test)."""
    found: Tracing | None = _for_provider("trace", trace.get_tracer_provider(), _make_tracing)
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


register(Hooks(tracer=tracing, instruments=instruments))
