"""The seam between taskq and OpenTelemetry: every traced place in the core calls one of these, and each
returns a do-nothing object at once unless OpenTelemetry is in use in this process.

"In use" means: the application has imported OpenTelemetry (`opentelemetry` is in sys.modules: taskq
never imports it first) and set a real tracer provider (or, for metrics, meter provider), and
TASKQ_OTEL is not `off`. Then taskq.contrib.otel (extra `taskq[otel]`) does the work. Without the extra,
or with it installed but not configured, a traced place costs one dictionary lookup.

The core does not import taskq.contrib.otel, nor know its name: it calls the hooks an integration
registered here (`register`). The first traced place that finds OpenTelemetry imported loads the tracing
integrations the installed distributions declare (entry points of the group `INTEGRATIONS`; taskq's own
pyproject.toml declares taskq.contrib.otel there), and each registers itself as it is imported.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

_OFF: AbstractContextManager[Any] = contextlib.nullcontext(None)
FIRST_ATTEMPT = "taskq_first_attempt"
"""The key of jobs.trace_context under which a retry's write stores the first traced attempt's span (a
W3C traceparent), for every later attempt's span to link to."""
INTEGRATIONS = "taskq.tracing"
"""The entry-point group of tracing integrations, loaded when the application has imported OpenTelemetry;
each calls `register` as it is imported."""
_loaded = False
_off: bool | None = None


class Tracer(Protocol):
    """Spans for the traced places, for the tracer provider set now (what `Hooks.tracer` returns)."""

    def producer(self, queue: str, actor: str, job_id: UUID | None, count: int,
                 parent: Any = None) -> AbstractContextManager[str | None]: ...

    def consumer(self, job: Any, isolation: str) -> AbstractContextManager[Any]: ...

    def carrier(self) -> dict[str, str]: ...

    def ids(self) -> dict[str, str]: ...


@dataclass(frozen=True, slots=True)
class Hooks:
    """What an integration gives taskq. Each is called per traced place or metric update and answers for
    the providers set at that moment: None while the application has set none."""

    tracer: Callable[[], Tracer | None]
    instruments: Callable[[], Any]
    """The cancellation spec §10 instruments (taskq.metrics), or None."""


_hooks: Hooks | None = None


def register(hooks: Hooks) -> None:
    """Trace and count through `hooks` from now on (an integration calls this when it is imported)."""
    global _hooks
    _hooks = hooks


def hooks() -> Hooks | None:
    """The registered integration's hooks while the application uses OpenTelemetry in this process, else
    None. Loads the integration the first time it finds OpenTelemetry imported."""
    if "opentelemetry" not in sys.modules:
        return None
    global _loaded
    if _hooks is None and not _loaded:
        _loaded = True
        from importlib.metadata import entry_points

        for entry in entry_points(group=INTEGRATIONS):
            entry.load()
    return _hooks


def _switched_off() -> bool:
    """TASKQ_OTEL is off (read once per process: it is set before the process starts)."""
    global _off
    if _off is None:
        _off = os.environ.get("TASKQ_OTEL", "").lower() in ("off", "0", "false")
    return _off


def active() -> Tracer | None:
    """The integration's tracer when OpenTelemetry traces in this process, else None."""
    if _hooks is not None and _off is False:  # once found in use (an integration registers only once imported)
        return _hooks.tracer()
    if "opentelemetry" not in sys.modules or _switched_off():
        return None
    found = hooks()
    return None if found is None else found.tracer()


def producer(queue: str, actor: str, job_id: UUID | None, count: int = 1,
             parent: Any = None) -> AbstractContextManager[str | None]:
    """A producer span around an enqueue of `count` jobs; it gives the JSON text of the W3C trace context
    to store on the job(s), or None when not tracing. `parent`: the consumer span (what `consumer` gave)
    of the attempt that enqueues, else the caller's current span is the parent."""
    tracer = active()
    return _OFF if tracer is None else tracer.producer(queue, actor, job_id, count, parent)


def consumer(job: Any, isolation: str) -> AbstractContextManager[Any]:
    """A consumer span around one attempt of a claimed job (taskq.backend.workers.ClaimedJob), current while
    the actor runs; it gives an object whose `outcome(name, error_type)` records how the attempt ended and
    whose `traceparent()` is the span for later attempts to link to, or None when not tracing."""
    tracer = active()
    return _OFF if tracer is None else tracer.consumer(job, isolation)


def carrier() -> dict[str, str] | None:
    """The current trace context as W3C headers, for a process actor's child; None when not tracing."""
    tracer = active()
    return None if tracer is None else tracer.carrier()


@contextlib.contextmanager
def attached(headers: dict[str, str] | None) -> Iterator[None]:
    """In a process actor's child: the worker's consumer span is the current one while the actor runs.
    Imports OpenTelemetry only when the worker sent a context (it traces)."""
    if not headers:
        yield
        return
    try:
        from opentelemetry import context, propagate
    except ImportError:
        yield
        return
    token = context.attach(propagate.extract(headers))
    try:
        yield
    finally:
        context.detach(token)


def id_text(job: Any) -> str:
    """A claimed job's id as text, made once and kept on the job (ClaimedJob.id_text) for its log lines and
    its span: a UUID's str() costs over a microsecond."""
    text: str | None = getattr(job, "id_text", None)
    if text is None:
        text = str(job.id)
        try:
            job.id_text = text
        except AttributeError:  # a job object without room for it
            pass
    return text


def trace_ids() -> dict[str, str]:
    """trace_id and span_id of the current span (hex) for log records, or {} when not tracing."""
    tracer = active()
    return {} if tracer is None else tracer.ids()
