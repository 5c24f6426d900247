"""Prometheus metrics. In the supervisor's multiprocess mode these are aggregated across workers."""

from __future__ import annotations

import sys
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

CANCELLATION_REQUESTED = Counter(
    "taskq_cancellation_requested", "JobsClient.cancel() calls, exactly one per call, whatever the outcome"
)
CANCELLATION_PHASE_TRANSITIONS = Counter(
    "taskq_cancellation_phase_transitions",
    "Cancellation ladder transitions in the worker",
    ["from_phase", "to_phase"],
)
JOBS_CLAIMED = Counter("taskq_jobs_claimed", "Jobs claimed by this worker", ["queue"])
JOBS_COMPLETED = Counter("taskq_jobs_completed", "Jobs finished by this worker, by outcome", ["status"])
JOB_DURATION = Histogram(
    "taskq_job_duration_seconds",
    "Actor run time per attempt",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800),
)
JOBS_IN_FLIGHT = Gauge("taskq_jobs_in_flight", "Jobs held by this worker", multiprocess_mode="livesum")
STALE_WRITES = Counter("taskq_stale_writes", "Fenced writes that changed nothing (a newer attempt owns the row)")
HEARTBEAT_TICK = Histogram(
    "taskq_heartbeat_tick_duration_seconds",
    "Duration of one heartbeat transaction",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
HEARTBEAT_FAILURES = Gauge(
    "taskq_heartbeat_consecutive_failures", "Heartbeat ticks failed in a row", multiprocess_mode="livemax"
)
JOBS_SWEPT = Counter("taskq_jobs_swept", "Expired leases reclaimed by the sweeper, by verdict", ["verdict"])
LEAKED_THREADS = Gauge("taskq_leaked_threads", "Actor threads that never left after a forced cancel",
                       multiprocess_mode="livesum")
WORKER_RESTARTS = Counter("taskq_worker_restarts", "Workers replaced by the supervisor")
SHUTDOWN_JOBS = Counter(
    "taskq_shutdown_jobs", "Jobs in flight at a worker shutdown, by what became of them", ["outcome"]
)
ROWS_PRUNED = Counter(
    "taskq_rows_pruned", "Rows deleted by retention, by class (succeeded, failed, attempts, receipts, audit, events)",
    ["class"],
)
JOBS_SNOOZED = Counter("taskq_jobs_snoozed", "Attempts that ended with the actor raising taskq.Snooze")
SCHEDULE_SLOTS = Counter("taskq_schedule_slot_jobs", "Slot jobs this worker's scheduler inserted")
SCHEDULE_TICK = Histogram(
    "taskq_schedule_tick_duration_seconds",
    "Duration of one scheduler tick (its one transaction)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
QUEUE_PAUSED = Gauge(
    "taskq_queue_paused", "1 while the queue is paused fleet-wide (as this worker last read it)", ["queue"],
    multiprocess_mode="livemax",
)
QUEUE_LIMIT = Gauge(
    "taskq_queue_limit",
    "A queue's fleet-wide limit as this worker last read it (0: none): concurrency, concurrency_per_key, "
    "rate (starts per second)",
    ["queue", "limit"],
    multiprocess_mode="livemax",
)
LIMITED_CLAIMS = Counter(
    "taskq_limited_claims", "Limited claims (under queue or actor limits) by this worker, by whether they got jobs",
    ["result"],
)


# -- the cancellation spec §10 metrics: Prometheus always, OpenTelemetry instruments too when the
# application has set an OpenTelemetry meter provider (taskq.contrib.otel; nothing imported otherwise)


def _otel() -> Any:
    if "opentelemetry" not in sys.modules:
        return None
    from taskq.contrib import otel

    return otel.instruments()


def cancellation_requested() -> None:
    CANCELLATION_REQUESTED.inc()
    if (instruments := _otel()) is not None:
        instruments.requested.add(1)


def cancellation_phase_transition(from_phase: str, to_phase: str) -> None:
    CANCELLATION_PHASE_TRANSITIONS.labels(from_phase=from_phase, to_phase=to_phase).inc()
    if (instruments := _otel()) is not None:
        instruments.transitions.add(1, {"from_phase": from_phase, "to_phase": to_phase})


def heartbeat_tick(seconds: float) -> None:
    HEARTBEAT_TICK.observe(seconds)
    if (instruments := _otel()) is not None:
        instruments.tick.record(seconds)


def heartbeat_failures(count: int) -> None:
    HEARTBEAT_FAILURES.set(count)
    if (instruments := _otel()) is not None:
        instruments.failures.set(count)
