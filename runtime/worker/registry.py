"""ActiveJobRegistry: the jobs this worker holds, with their in-process cancellation state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq.models import CancelOrigin, CancelPhase

if TYPE_CHECKING:
    from taskq.actors.declaration import Actor
    from taskq.actors.executors import Executor
    from taskq.backend.workers import ClaimedJob
    from taskq.context import JobContext


@dataclass(eq=False)
class ActiveJob:
    """One held job. `cancel_phase` is the in-process ladder position (ABANDON_PENDING never persisted);
    `cancel_observed_at` is on the event loop's monotonic clock (`loop.time()`)."""

    job: ClaimedJob
    actor: Actor[Any, Any] | None = None
    ctx: JobContext[Any] | None = None
    task: asyncio.Task[Any] | None = None
    executor: Executor | None = None
    cancel_phase: CancelPhase = CancelPhase.NONE
    cancel_origin: CancelOrigin | None = None
    cancel_observed_at: float | None = None
    stop_cause: str | None = None
    """Why the worker stopped the attempt when the cause is not a cancel: 'timeout' or 'deadline'."""
    forced: bool = False
    """The worker forced the attempt (phase 2, a timeout, a shutdown, a lost lease): its actor did not
    stop by itself."""
    finishing: bool = False
    """The consumer has started its terminal write; the heartbeat no longer treats a missing row as lost."""
    timers: list[asyncio.TimerHandle] = field(default_factory=list)
    isolation: str = "async"
    """The isolation class whose slot the job takes (set by the registry when it is added)."""
    span: Any = None
    """The attempt's consumer span (taskq.tracing.consumer) while it runs, when tracing."""

    @property
    def id(self) -> UUID:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def claim_epoch(self) -> int:
        return self.job.claim_epoch

    def request_cancel(self, origin: CancelOrigin) -> None:
        """Record why, then signal the actor. An operator's request wins over infrastructure origins;
        otherwise the first origin sticks."""
        if self.cancel_origin is None or origin is CancelOrigin.OPERATOR:
            self.cancel_origin = origin
        if self.ctx is not None:
            self.ctx.request_cancel(origin)
        if self.executor is not None:
            self.executor.request_cancel(self)

    def force(self, why: str) -> None:
        """The force path: through the executor once the actor started, else cancel the consumer task."""
        self.forced = True
        if self.executor is not None:
            self.executor.force_cancel(self)
        elif self.task is not None:
            self.task.cancel(msg=f"taskq: {why}")

    @property
    def effect_unknown(self) -> bool:
        """A non-idempotent actor started and had to be forced: whatever it did may be half done, so the
        attempt must not be re-run blindly."""
        return bool(self.executor is not None and self.forced and self.actor is not None
                    and not self.actor.idempotent)

    def drop_lease(self) -> None:
        """This worker no longer holds the row (or cannot prove it does): stop the actor, write nothing."""
        self.request_cancel(CancelOrigin.LEASE_LOST)
        self.cancel_origin = CancelOrigin.LEASE_LOST
        self.finishing = True
        self.force("lease lost")


class ActiveJobRegistry:
    """The held jobs, and how many of them each isolation class holds. `class_of(actor name)` says whose
    slot a job takes in a worker of several classes; without it every job takes a slot of `single` (a
    worker of one class), and the count per class is the count of held jobs, kept by nobody."""

    def __init__(self, class_of: Callable[[str], str] | None = None, *, single: str = "async") -> None:
        self._jobs: dict[UUID, ActiveJob] = {}
        self._class_of = class_of
        self._single = single
        self._held: dict[str, int] = {}

    @property
    def held_by_class(self) -> dict[str, int]:
        """Held jobs per isolation class."""
        if self._class_of is None:
            return {self._single: len(self._jobs)}
        return self._held

    def add(self, entry: ActiveJob) -> None:
        if entry.id in self._jobs:
            self.remove(entry.id)
        self._jobs[entry.id] = entry
        if self._class_of is None:
            entry.isolation = self._single
        else:
            isolation = entry.isolation = self._class_of(entry.job.actor)
            self._held[isolation] = self._held.get(isolation, 0) + 1

    def remove(self, job_id: UUID, entry: ActiveJob | None = None) -> None:
        current = self._jobs.get(job_id)
        if current is not None and (entry is None or current is entry):
            del self._jobs[job_id]
            if self._class_of is not None:
                self._held[current.isolation] -= 1

    def class_of_job(self, job_id: UUID) -> str:
        """The isolation class of a held job (async for one no longer held)."""
        entry = self._jobs.get(job_id)
        return entry.isolation if entry is not None else "async"

    def get(self, job_id: UUID) -> ActiveJob | None:
        return self._jobs.get(job_id)

    def __iter__(self) -> Iterator[ActiveJob]:
        return iter(list(self._jobs.values()))

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def held(self) -> list[tuple[UUID, int]]:
        return [(e.id, e.claim_epoch) for e in self._jobs.values()]
