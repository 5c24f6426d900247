"""The consumer span's parent, read from a job's stored trace context (its JSON text, as the claim returns
it): taskq's direct read of a plain W3C traceparent gives exactly what the global propagator gives, and
anything else goes to the propagator."""

from __future__ import annotations

import json

import pytest
from opentelemetry import baggage, propagate, trace

from taskq.contrib.otel import _stored_parent
from taskq.tracing import FIRST_ATTEMPT

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


FAST = [{"traceparent": f"00-{TRACE}-{SPAN}-01"}, {"traceparent": f"00-{TRACE}-{SPAN}-00"},
        {"traceparent": f"00-{'0' * 32}-{SPAN}-01"}, {"traceparent": f"00-{TRACE}-{'0' * 16}-01"}]


@pytest.mark.parametrize("stored", [
    {"traceparent": f"00-{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-00"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", FIRST_ATTEMPT: f"00-{TRACE}-{'1' * 16}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=abc,other=x"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "baggage": "tenant=7"},
    {"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"},
    {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
    {"traceparent": f"ff-{TRACE}-{SPAN}-01"},
    {"traceparent": f"01-{TRACE}-{SPAN}-01-future"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01-extra"},
    {"traceparent": "garbage"},
    {"b3": f"{TRACE}-{SPAN}-1"},
    {},
], ids=["sampled", "unsampled", "first-attempt-key", "tracestate", "baggage", "uppercase", "zero-trace",
        "zero-span", "version-ff", "future-version", "00-with-extra", "garbage", "b3-only", "empty"])
def test_the_parent_is_what_the_global_propagator_reads(stored: dict[str, str]) -> None:
    # the text as jsonb writes it back: ", " and ": " between items (json.dumps' default)
    created, span_context, headers = _stored_parent(json.dumps(stored))
    # the text's fast path: a version-00 traceparent of lowercase hex and nothing else
    assert (headers is None) == (stored in FAST), headers
    assert headers is None or headers == stored
    expected_context = propagate.extract(stored)
    expected = trace.get_current_span(expected_context).get_span_context()
    assert span_context == expected
    assert trace.get_current_span(created).get_span_context() == expected
    assert span_context.is_remote == expected.is_remote
    assert span_context.trace_state == expected.trace_state
    assert baggage.get_all(created) == baggage.get_all(expected_context)


def test_a_plain_traceparent_is_read_as_a_valid_remote_parent() -> None:
    _, span_context, _ = _stored_parent(f'{{"traceparent": "00-{TRACE}-{SPAN}-01"}}')
    assert span_context.is_valid and span_context.is_remote
    assert (span_context.trace_id, span_context.span_id) == (int(TRACE, 16), int(SPAN, 16))
    assert span_context.trace_flags.sampled


@pytest.mark.parametrize("text", ["null", "[]", '"00-x"', "7"])
def test_a_stored_value_that_is_not_an_object_gives_no_parent(text: str) -> None:
    created, span_context, _ = _stored_parent(text)
    assert not span_context.is_valid
    assert not trace.get_current_span(created).get_span_context().is_valid


def test_the_jobs_of_one_batch_share_one_parent_and_another_context_gets_its_own() -> None:
    # one enqueue_many call stores the same trace context on every job: the worker reads it once
    one = f'{{"traceparent": "00-{TRACE}-{SPAN}-01"}}'
    first = _stored_parent(one)
    assert _stored_parent("".join(one)) is first  # an equal text, not the same object
    other = _stored_parent(f'{{"traceparent": "00-{TRACE}-{"1" * 16}-01"}}')
    assert other is not first and other[1].span_id == int("1" * 16, 16)
    # what is not read by the fast path is never served from the last fast read
    assert _stored_parent(f'{{"traceparent": "00-{TRACE.upper()}-{SPAN}-01"}}')[2] is not None
    again = _stored_parent(one)
    assert again[1] == first[1] and again[1].span_id == int(SPAN, 16)
