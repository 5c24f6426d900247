"""A worker that timestamps each job's way from its NOTIFY to its actor's start, for latency.py's traced
leg: the actor `bench.trace` returns, for its own job, when (time.time(), this host's clock):

- `notified`: the listener handed the dispatcher the last NOTIFY before the claim (ClaimWake.set);
- `claim_sent` / `claim_back`: the claim that took the job was sent / its rows were back (WorkerStore.claim);
- `spawned`: the dispatcher handed the job to the consumers (Consumers.spawn);
- `started`: the actor's first line.

The wrappers are put on the classes when the worker imports this app, before it wires its parts; they
add a few microseconds per claim and per job, which is why latency.py reports the untraced worker's
figures apart. The worker runs it as `benchmarks.pickup_trace_app:actors` (repository root as cwd).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from taskq import JobContext
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend.workers import ClaimedJob, WorkerStore
from taskq.worker.consumer import Consumers
from taskq.worker.dispatcher import ClaimWake

TRACE = "bench.trace"
actors = ActorRegistry()
_notified = 0.0
_marks: dict[UUID, dict[str, float]] = {}


def _wrap_set(original: Callable[[ClaimWake], None]) -> Callable[[ClaimWake], None]:
    @functools.wraps(original)
    def wake_set(self: ClaimWake) -> None:
        global _notified
        _notified = time.time()
        original(self)

    return wake_set


def _wrap_claim(original: Any) -> Any:
    @functools.wraps(original)
    async def claim(self: WorkerStore, queues: Sequence[str], limit: int, lock_timeout: float) -> list[ClaimedJob]:
        notified, sent = _notified, time.time()
        jobs: list[ClaimedJob] = await original(self, queues, limit, lock_timeout)
        back = time.time()
        for job in jobs:
            _marks[job.id] = {"notified": notified, "claim_sent": sent, "claim_back": back}
        return jobs

    return claim


def _wrap_spawn(original: Callable[[Consumers, ClaimedJob], None]) -> Callable[[Consumers, ClaimedJob], None]:
    @functools.wraps(original)
    def spawn(self: Consumers, job: ClaimedJob) -> None:
        marks = _marks.get(job.id)
        if marks is not None:
            marks["spawned"] = time.time()
        original(self, job)

    return spawn


ClaimWake.set = _wrap_set(ClaimWake.set)  # type: ignore[method-assign,assignment]
WorkerStore.claim = _wrap_claim(WorkerStore.claim)  # type: ignore[method-assign]
Consumers.spawn = _wrap_spawn(Consumers.spawn)  # type: ignore[method-assign,assignment]


@actor(name=TRACE, registry=actors)
async def trace(payload: float, ctx: JobContext[float]) -> dict[str, float]:
    """The payload is the enqueue time; the result is this job's timestamps (above)."""
    started = time.time()
    return _marks.pop(ctx.job_id, {}) | {"started": started}
