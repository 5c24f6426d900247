"""The no-op actors of benchmarks/apps.py in a worker that traces: importing this sets an OpenTelemetry
SDK tracer provider exporting every span to memory through a BatchSpanProcessor (as a production set-up
would: the export runs on the SDK's own thread), for benchmarks/otel.py."""

from __future__ import annotations

import importlib
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

actors: Any = importlib.import_module("benchmarks.apps").actors  # the APP: benchmarks.otel_app:actors

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(BatchSpanProcessor(EXPORTER, max_queue_size=100_000))
trace.set_tracer_provider(_provider)
