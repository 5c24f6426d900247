"""The no-op actors of benchmarks/apps.py in a worker that traces: importing this sets an OpenTelemetry
SDK tracer provider exporting every span to memory (SimpleSpanProcessor: the export runs inline, at each
span's end), for benchmarks/otel.py."""

from __future__ import annotations

import importlib
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

actors: Any = importlib.import_module("benchmarks.apps").actors  # the APP: benchmarks.otel_app:actors

EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)
