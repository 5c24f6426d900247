-- taskq schema, version 7: the W3C trace context a job was enqueued in, for OpenTelemetry.
--
-- {"traceparent": ..., "tracestate": ...} as the producer's propagator wrote it, or NULL (OpenTelemetry
-- not in use, or no span current at enqueue). The worker continues that trace in its consumer span
-- (taskq.contrib.otel). A plain nullable column: adding it rewrites nothing, and NULL costs no space.

ALTER TABLE taskq.jobs ADD COLUMN trace_context jsonb;
