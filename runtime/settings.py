"""`WorkerSettings`: every field reads env `TASKQ_<FIELD>` and has a CLI flag `--<field-with-dashes>`."""

from __future__ import annotations

import math
import os
import socket
from typing import Annotated, Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
RetentionSeconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A keep window: seconds after a row finished before it is pruned; 0 keeps the class forever."""

ISOLATION_CLASSES = ("async", "thread", "process")
"""The isolation classes of actors, each with its own capacity in a worker (`WorkerSettings.capacities`)."""

DEFAULT_CONCURRENCY = 200
"""Async actors one worker runs at once when `concurrency` is not set: twice the default claim batch, so
that one batch runs while the statements of the other (its outcomes, the next claim) are in flight. At
10 (the default until now) a worker spent its time waiting for round trips; 100 measured slower and less
steady than 200 on one process (benchmarks/README.md, "Issue 13")."""


def _default_max_children() -> int:
    return max(1, os.cpu_count() or 1)


class WorkerSettings(BaseSettings):
    """Configuration of one worker process (and of the supervisor that forks them). Seconds are floats."""

    model_config = SettingsConfigDict(env_prefix="TASKQ_", extra="forbid", validate_default=True)

    dsn: SecretStr | None = None
    """PostgreSQL DSN; None uses the embedded server."""
    listen_dsn: SecretStr | None = None
    """DSN for the LISTEN connection when `dsn` goes through a transaction pooler; default: `dsn`
    (with `transaction_pooler`, default: no LISTEN at all)."""
    transaction_pooler: bool = False
    """`dsn` goes through a transaction-pooling proxy (PgBouncer with pool_mode=transaction): no
    startup options and no prepared statements on it, and no LISTEN on it either (a pooled LISTEN
    would miss notifications): LISTEN uses `listen_dsn` when given; without it the worker polls every
    `poll_interval` and cancel requests arrive with the heartbeat."""
    queues: Annotated[list[str], NoDecode] = ["default"]
    concurrency: Annotated[int, Field(ge=1, le=100_000)] | None = None
    """Async jobs one worker runs at once (the capacity of its async class; jobs of an actor the worker does
    not know count there too). Unset (None): DEFAULT_CONCURRENCY (200), whatever other actors the APP has:
    thread jobs have their own capacity (`max_threads`) and process jobs theirs (`max_children`), so a full
    process pool never holds back async jobs (docs/isolation.md). See `capacities`."""
    heartbeat_interval: Seconds = 10.0
    lock_timeout: Seconds = 60.0
    cancellation_grace_period: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 30.0
    cleanup_grace_period: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 10.0
    shutdown_timeout: Seconds | None = None
    """Watchdog budget from the first shutdown trigger; default grace + cleanup + 10 s."""
    poll_interval: Seconds = 1.0
    sweep_interval: Seconds = 10.0
    claim_batch_size: Annotated[int, Field(ge=1, le=10_000)] = 100
    """Most jobs one claim statement takes; a claim asks for min(free slots, this)."""
    schedule_poll_interval: Seconds = 1.0
    """Longest wait of the scheduler between two looks at the schedules table (it wakes at the next slot
    it knows of sooner): how soon a resume, or a schedule declared by another worker, is seen."""
    max_threads: Annotated[int, Field(ge=1, le=10_000)] = 16
    """Thread jobs one worker runs at once (the capacity of its thread class): one thread each."""
    max_children: Annotated[int, Field(ge=1, le=1_000)] = Field(default_factory=_default_max_children)
    """Process jobs one worker runs at once (the capacity of its process class): one child process each;
    default: the number of CPUs."""
    max_leaked_threads: Annotated[int, Field(ge=0)] = 0
    max_tasks_per_child: Annotated[int, Field(ge=0)] = 0
    """Recycle a child process after this many jobs; 0 = never."""
    max_memory_per_child: Annotated[int, Field(ge=0)] = 0
    """Recycle a child process whose RSS exceeds this many bytes after a job; 0 = never."""
    hook_timeout: Seconds = 3.0
    worker_timeout: Seconds = 30.0
    metrics_port: Annotated[int, Field(ge=0, le=65535)] = 9464
    metrics_host: str = "127.0.0.1"
    worker_id: str | None = None
    """Default: `<host>:<pid>:<random>`, fixed at startup."""
    retention_succeeded: RetentionSeconds = 86400.0
    """Seconds succeeded and cancelled jobs (with their events) are kept after they finish; 0 = forever."""
    retention_failed: RetentionSeconds = 604800.0
    """Seconds failed, crashed and abandoned jobs (with their events) are kept after they finish; 0 = forever."""
    retention_attempts: RetentionSeconds = 2592000.0
    """Seconds job_attempts rows are kept after their attempt finished (they outlive their jobs); 0 = forever."""
    retention_receipts: RetentionSeconds = 86400.0
    """Seconds the web API's idempotency receipts are kept (a key is honoured for at most 24 h anyway,
    docs/web.md); 0 = forever."""
    retention_audit: RetentionSeconds = 7776000.0
    """Seconds the web API's operator audit rows are kept (default 90 days; under an hour counts as an
    hour); 0 = forever."""
    prune_interval: Seconds = 60.0
    """Seconds between two prunes of a worker (each worker prunes; they share the work safely)."""
    log_format: Literal["text", "json"] = "text"
    """`json`: one JSON object per log line, with job_id, actor, attempt, queue, worker_id and trace_id when known."""
    log_job_lines: bool = True
    """An INFO line at each job attempt's start and finish, with its duration and outcome (payloads never)."""

    @field_validator("queues", mode="before")
    @classmethod
    def _split_queues(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [q.strip() for q in value.split(",")]
        return value

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: list[str]) -> list[str]:
        if not value or any(not q or len(q) > 255 for q in value):
            raise ValueError("queues must be a non-empty list of non-empty names (at most 255 chars)")
        return value

    @model_validator(mode="after")
    def _check_windows(self) -> WorkerSettings:
        if self.lock_timeout <= self.heartbeat_interval:
            raise ValueError(
                f"lock_timeout ({self.lock_timeout}) must be longer than heartbeat_interval "
                f"({self.heartbeat_interval}), or every lease expires between two renewals"
            )
        if self.shutdown_timeout is None:
            self.shutdown_timeout = self.cancellation_grace_period + self.cleanup_grace_period + 10.0
        assert math.isfinite(self.shutdown_timeout)
        return self

    def resolved_concurrency(self) -> int:
        """The async capacity: `concurrency`, or DEFAULT_CONCURRENCY when unset."""
        return self.concurrency if self.concurrency is not None else DEFAULT_CONCURRENCY

    def capacities(self) -> dict[str, int]:
        """Jobs of each isolation class one worker runs at once: async up to `concurrency` (default
        DEFAULT_CONCURRENCY), thread up to `max_threads`, process up to `max_children`."""
        return {"async": self.resolved_concurrency(), "thread": self.max_threads, "process": self.max_children}

    @property
    def effective_shutdown_timeout(self) -> float:
        assert self.shutdown_timeout is not None
        return self.shutdown_timeout

    def dsn_value(self) -> str | None:
        return self.dsn.get_secret_value() if self.dsn is not None else None

    def listen_dsn_value(self) -> str | None:
        return self.listen_dsn.get_secret_value() if self.listen_dsn is not None else self.dsn_value()

    def listens(self) -> bool:
        """Whether the worker holds a LISTEN connection (not on a pooled `dsn` without `listen_dsn`)."""
        return not self.transaction_pooler or self.listen_dsn is not None

    def resolved_worker_id(self) -> str:
        if self.worker_id is None:
            self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
        return self.worker_id
