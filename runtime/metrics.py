"""Prometheus metrics. In the supervisor's multiprocess mode these are aggregated across workers.

Importing this module imports no prometheus_client and creates no collector: each name below stands in
for one collector, and the first use of any of them (in the process that uses them) imports
prometheus_client and creates them all in its default registry. prometheus_client chooses in-memory or
file-backed values (PROMETHEUS_MULTIPROC_DIR) when it is first imported, so the supervisor can enter
multiprocess mode before anything counts, with no re-exec (taskq.supervisor.metrics_http); a worker it
forks creates them after the fork or inherits them, and either way writes to files of its own pid.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from taskq import tracing

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge, Histogram
    from prometheus_client.metrics import MetricWrapperBase

M = TypeVar("M", bound="MetricWrapperBase")

_declared: list[_Lazy[Any]] = []
_creating = threading.Lock()


class _Lazy(Generic[M]):
    """One collector, created with all the others at the first use of any of them."""

    __slots__ = ("_args", "_kwargs", "_made")

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = (), **kwargs: Any) -> None:
        self._args = (name, documentation, tuple(labelnames))
        self._kwargs = kwargs
        self._made: M | None = None
        _declared.append(self)

    def _create(self) -> M:
        raise NotImplementedError

    def _get(self) -> M:
        made = self._made
        if made is None:
            with _creating:  # two threads' first uses must not register a collector twice
                for lazy in _declared:
                    if lazy._made is None:
                        lazy._made = lazy._create()
            made = self._made
            assert made is not None
        return made

    def labels(self, *values: str, **labels: str) -> M:
        return self._get().labels(*values, **labels)

    def __getattr__(self, name: str) -> Any:
        """The collector's other attributes (tests read `_value`)."""
        if name in _Lazy.__slots__:
            raise AttributeError(name)  # not yet set (a copy being built): never create the collectors for it
        return getattr(self._get(), name)


class LazyCounter(_Lazy["Counter"]):
    __slots__ = ()

    def _create(self) -> Counter:
        from prometheus_client import Counter

        return Counter(*self._args, **self._kwargs)

    def inc(self, amount: float = 1) -> None:
        self._get().inc(amount)


class LazyGauge(_Lazy["Gauge"]):
    __slots__ = ()

    def _create(self) -> Gauge:
        from prometheus_client import Gauge

        return Gauge(*self._args, **self._kwargs)

    def inc(self, amount: float = 1) -> None:
        self._get().inc(amount)

    def dec(self, amount: float = 1) -> None:
        self._get().dec(amount)

    def set(self, value: float) -> None:
        self._get().set(value)


class LazyHistogram(_Lazy["Histogram"]):
    __slots__ = ()

    def _create(self) -> Histogram:
        from prometheus_client import Histogram

        return Histogram(*self._args, **self._kwargs)

    def observe(self, amount: float) -> None:
        self._get().observe(amount)


CANCELLATION_REQUESTED = LazyCounter(
    "taskq_cancellation_requested", "JobsClient.cancel() calls, exactly one per call, whatever the outcome"
)
CANCELLATION_PHASE_TRANSITIONS = LazyCounter(
    "taskq_cancellation_phase_transitions",
    "Cancellation ladder transitions in the worker",
    ["from_phase", "to_phase"],
)
JOBS_CLAIMED = LazyCounter("taskq_jobs_claimed", "Jobs claimed by this worker", ["queue"])
JOBS_COMPLETED = LazyCounter("taskq_jobs_completed", "Jobs finished by this worker, by outcome", ["status"])
JOB_DURATION = LazyHistogram(
    "taskq_job_duration_seconds",
    "Actor run time per attempt",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800),
)
JOBS_IN_FLIGHT = LazyGauge("taskq_jobs_in_flight", "Jobs held by this worker", multiprocess_mode="livesum")
JOBS_BUSY = LazyGauge(
    "taskq_jobs_busy", "Slots of each isolation class taken by held jobs (as the worker last claimed)", ["isolation"],
    multiprocess_mode="livesum",
)
WORKER_CAPACITY = LazyGauge(
    "taskq_worker_capacity", "Jobs of each isolation class the workers run at once (async, thread, process)",
    ["isolation"], multiprocess_mode="livesum",
)
STALE_WRITES = LazyCounter("taskq_stale_writes", "Fenced writes that changed nothing (a newer attempt owns the row)")
HEARTBEAT_TICK = LazyHistogram(
    "taskq_heartbeat_tick_duration_seconds",
    "Duration of one heartbeat transaction",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
HEARTBEAT_FAILURES = LazyGauge(
    "taskq_heartbeat_consecutive_failures", "Heartbeat ticks failed in a row", multiprocess_mode="livemax"
)
LISTENER_RECONNECTS = LazyCounter(
    "taskq_listener_reconnects",
    "LISTEN connections given up and opened again, by reason: lost (an error on the connection), standby (its "
    "server is in recovery), not_listening (the session lost its LISTENs), probe_timeout (no answer)",
    ["reason"],
)
LISTENER_CONNECTED_AT = LazyGauge(
    "taskq_listener_connected_since_seconds",
    "Unix time at which the worker's LISTEN connection was opened (its age is now minus this); 0 while it has "
    "none, when the worker finds new jobs by polling every poll_interval",
    multiprocess_mode="liveall",
)
JOBS_SWEPT = LazyCounter("taskq_jobs_swept", "Expired leases reclaimed by the sweeper, by verdict", ["verdict"])
LEAKED_THREADS = LazyGauge("taskq_leaked_threads", "Actor threads that never left after a forced cancel",
                           multiprocess_mode="livesum")
WORKER_RESTARTS = LazyCounter("taskq_worker_restarts", "Workers replaced by the supervisor")
SHUTDOWN_JOBS = LazyCounter(
    "taskq_shutdown_jobs", "Jobs in flight at a worker shutdown, by what became of them", ["outcome"]
)
ROWS_PRUNED = LazyCounter(
    "taskq_rows_pruned", "Rows deleted by retention, by class (succeeded, failed, attempts, receipts, audit, events)",
    ["class"],
)
JOBS_SNOOZED = LazyCounter("taskq_jobs_snoozed", "Attempts that ended with the actor raising taskq.Snooze")
SCHEDULE_SLOTS = LazyCounter("taskq_schedule_slot_jobs", "Slot jobs this worker's scheduler inserted")
SCHEDULE_TICK = LazyHistogram(
    "taskq_schedule_tick_duration_seconds",
    "Duration of one scheduler tick (its one transaction)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
QUEUE_PAUSED = LazyGauge(
    "taskq_queue_paused", "1 while the queue is paused fleet-wide (as this worker last read it)", ["queue"],
    multiprocess_mode="livemax",
)
QUEUE_LIMIT = LazyGauge(
    "taskq_queue_limit",
    "A queue's fleet-wide limit as this worker last read it (0: none): concurrency, concurrency_per_key, "
    "rate (starts per second)",
    ["queue", "limit"],
    multiprocess_mode="livemax",
)
LIMITED_CLAIMS = LazyCounter(
    "taskq_limited_claims", "Limited claims (under queue or actor limits) by this worker, by whether they got jobs",
    ["result"],
)


# -- the cancellation spec §10 metrics: Prometheus always, OpenTelemetry instruments too when the
# application has set an OpenTelemetry meter provider (the hooks taskq.contrib.otel registers in
# taskq.tracing; nothing imported otherwise)


def _otel() -> Any:
    found = tracing.hooks()
    return None if found is None else found.instruments()


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
