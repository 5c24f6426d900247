"""The dispatcher claims batches up to the free slots of each isolation class; the listener
(taskq.worker.listener) wakes it on NOTIFY, a freed slot of a class it found full wakes it too. Polling every
`poll_interval` is the fallback."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from taskq.metrics import JOBS_BUSY, JOBS_CLAIMED, JOBS_IN_FLIGHT, LIMITED_CLAIMS
from taskq.worker.classes import CLASS_INDEX
from taskq.worker.decisions import (
    claim_pause,
    class_claim_sizes,
    classes_free,
    leftover,
    lingering_after,
    strays_due,
)

if TYPE_CHECKING:
    from taskq.backend.workers import ClaimedJob, WorkerStore
    from taskq.worker.classes import WorkerClasses
    from taskq.worker.completer import Completer
    from taskq.worker.queue_control import QueueControl
    from taskq.worker.registry import ActiveJobRegistry
    from taskq.worker.state import WorkerState

log = logging.getLogger("taskq.dispatcher")

BUSY_POLL = 0.01
"""Seconds: while jobs arrive faster than NOTIFYs, the next claim comes this soon (or at a NOTIFY) after
one that found jobs but fewer than it asked for, instead of after `poll_interval`. A producer that
enqueues without pause coalesces its NOTIFYs into one per up to 100 ms (backend_notify), so a worker
already taking its jobs keeps looking on its own. It starts when a claim finds more than one job (one
NOTIFY covered several: at light load each NOTIFY brings one job, and no claim follows the job), goes
on while claims find jobs, and stops after BUSY_POLLS claims in a row find none; so it costs at most
BUSY_POLLS empty claims per busy spell."""

BUSY_POLLS = 3

EMPTY: frozenset[str] = frozenset()


class ClaimWake:
    """What wakes the dispatcher: a NOTIFY (the listener), a freed slot it waits for, a stop. Made before
    the dispatcher, so that the completer and the consumers it feeds can be handed `slot_freed`."""

    def __init__(self, state: WorkerState, control: QueueControl) -> None:
        self._state = state
        self._control = control
        self.event = asyncio.Event()
        self.full: frozenset[str] | set[str] = EMPTY
        """The isolation classes whose slots were all taken at the last claim: a slot of one of them
        freed is a reason to claim again."""

    def set(self) -> None:
        self.event.set()

    def slot_freed(self, isolation: str | None = None) -> None:
        """A slot of `isolation` (None: of some class) is free. Only a dispatcher that found that class full
        has a reason to claim again; one that found the queue empty waits for a NOTIFY or its poll (waking
        it here would cost an empty claim per finished job)."""
        if (self.full if isolation is None else isolation in self.full) or self._state.draining:
            self.event.set()

    def limited_slot_freed(self) -> None:
        # a finish just committed: under limits, the slot it freed may be the one our claims wait for (a
        # worker that found its limits used up waits for a NOTIFY or its poll otherwise)
        if self._control.limited:
            self.event.set()


class Dispatcher:
    """Claims for `spawn(job)` (the consumers), each isolation class of `classes` within its capacity; a
    claim that lands after the stop began hands its rows to `release_unstarted(jobs)`. `unavailable(class)`:
    slots of a class that no held job takes but that are not free either (leaked threads)."""

    def __init__(
        self,
        store: WorkerStore,
        registry: ActiveJobRegistry,
        state: WorkerState,
        control: QueueControl,
        completer: Completer,
        wake: ClaimWake,
        *,
        spawn: Callable[[ClaimedJob], None],
        release_unstarted: Callable[[Sequence[ClaimedJob]], Awaitable[None]],
        queues: Sequence[str],
        classes: WorkerClasses,
        claim_batch_size: int,
        lock_timeout: float,
        poll_interval: float,
        unavailable: Callable[[str], int] | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._state = state
        self._control = control
        self._completer = completer
        self._wake = wake
        self.wake = wake.event
        self._spawn = spawn
        self._release_unstarted = release_unstarted
        self._queues = queues
        self._classes = classes
        self._claim_batch_size = claim_batch_size
        self._lock_timeout = lock_timeout
        self._poll_interval = poll_interval
        self.busy_poll = BUSY_POLL
        self.unavailable: Callable[[str], int] = unavailable or (lambda isolation: 0)
        """Slots of a class taken by no held job (threads leaked after a forced cancel keep theirs)."""
        self._strays_at: float | None = None
        # the mixed claim's actors, in the order of their class indexes
        self._known = sorted(classes.actors)
        self._busy = {c: JOBS_BUSY.labels(isolation=c) for c in classes.claimed}

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        backoff = 0.05
        lingering = BUSY_POLLS  # empty claims in a row since the busy poll found jobs (BUSY_POLLS: off)
        while not self._state.draining:
            free = self.free_slots()
            sizes = class_claim_sizes(free, self._claim_batch_size)
            if not sizes:
                self.wake.clear()
                self._wake.full = set(free)
                try:
                    await self.wake.wait()
                finally:
                    self._wake.full = EMPTY
                continue
            want = sum(sizes.values())
            sent = time.monotonic()
            try:
                jobs = await self.claim(sizes)
            except Exception as exc:
                log.warning("claim failed: %s (retrying in %.2fs)", exc, backoff)
                # a NOTIFY (the listener is back, so is the database) cuts the backoff short
                self.wake.clear()
                await self._wait(backoff)
                backoff = min(backoff * 2, self._poll_interval)
                continue
            backoff = 0.05
            if self._state.draining:  # stop arrived during the claim: run nothing new, give the rows back
                await self._release_unstarted(jobs)
                return
            for job in jobs:
                job.claim_sent = sent
                self._spawn(job)
            if jobs:
                # counted after the new consumers' first steps, which start the actors
                loop.call_soon(self._count, jobs)
            if len(jobs) < want:
                lingering = lingering_after(lingering, len(jobs), busy_polls=BUSY_POLLS)
                # a mixed worker pauses with some class full (its claim found no more of the others' work):
                # a slot of that class freed ends the pause. Only while it pauses: a finish between claims
                # must not cut the next pause short (one more claim per finished job)
                if self._classes.mixed:
                    taken = self.count_by_class(jobs)
                    self._wake.full = {c for c, n in free.items() if n - taken.get(c, 0) <= 0}
                try:
                    await self._wait(claim_pause(lingering, busy_polls=BUSY_POLLS, busy_poll=self.busy_poll,
                                                 poll_interval=self._poll_interval))
                finally:
                    self._wake.full = EMPTY
                self.wake.clear()

    def stop(self) -> None:
        """Wake it: it sees the worker draining and claims nothing more."""
        self.wake.set()

    async def claim(self, sizes: dict[str, int]) -> list[ClaimedJob]:
        """Up to `sizes[class]` jobs of each isolation class: limited work first (it takes at most what its
        limits leave), then the plain claim for the rest; each only when the worker's view of queue control
        says it may find something. A worker of one class claims as if it had one capacity (job_claim)."""
        control = self._control
        await control.refresh_if_due()
        if not self._classes.mixed:
            (want,) = sizes.values()
            jobs: list[ClaimedJob] = []
            if control.limited:
                jobs = await self._store.claim_limited(self._queues, want, self._lock_timeout,
                                                       queue_limits_only=control.queue_limits_only)
                LIMITED_CLAIMS.labels(result="jobs" if jobs else "empty").inc()
            if control.plain and len(jobs) < want:
                jobs += await self._store.claim(self._queues, want - len(jobs), self._lock_timeout)
            return jobs
        return await self._claim_mixed(sizes)

    async def _claim_mixed(self, sizes: dict[str, int]) -> list[ClaimedJob]:
        """A mixed worker's claim: the limited claim once per class (only that class's actors; the async
        one takes every actor but the thread and process ones, so that an unknown actor's job lands
        there), then job_claim_classes, then, at most once per poll_interval, job_claim_strays for the
        jobs of actors this worker does not know (on the async class's slots)."""
        control, classes = self._control, self._classes
        jobs: list[ClaimedJob] = []
        if control.limited:
            for isolation, n in sizes.items():
                if isolation == "async":
                    only = None
                    exclude = [a for a, c in classes.actors.items() if c != "async"]
                else:
                    only, exclude = classes.actors_of(isolation), None
                got = await self._store.claim_limited(self._queues, n, self._lock_timeout,
                                                      queue_limits_only=control.queue_limits_only,
                                                      only=only, exclude=sorted(exclude or ()))
                LIMITED_CLAIMS.labels(result="jobs" if got else "empty").inc()
                jobs += got
        if not control.plain:
            return jobs
        left = leftover(sizes, self.count_by_class(jobs))
        actors = [a for a in self._known if classes.actors[a] in left]
        if actors:
            slots = [left.get(c, 0) for c in CLASS_INDEX]
            got = await self._store.claim_classes(self._queues, actors,
                                                  [CLASS_INDEX[classes.actors[a]] for a in actors], slots,
                                                  self._lock_timeout)
            jobs += got
            left = leftover(left, self.count_by_class(got))
        now = asyncio.get_running_loop().time()
        if classes.stray in left and strays_due(self._strays_at, now, self._poll_interval):
            self._strays_at = now
            jobs += await self._store.claim_strays(self._queues, self._known, left[classes.stray],
                                                   self._lock_timeout)
        return jobs

    def count_by_class(self, jobs: Sequence[ClaimedJob]) -> dict[str, int]:
        if not self._classes.mixed:
            return {self._classes.stray: len(jobs)}
        found: dict[str, int] = {}
        class_of = self._classes.class_of
        for job in jobs:
            isolation = class_of(job.actor)
            found[isolation] = found.get(isolation, 0) + 1
        return found

    def free_slots(self) -> dict[str, int]:
        """Slots for new claims per isolation class (taskq.worker.decisions.class_free_slots): an async job
        whose outcome waits in the completer does not count (its actor is done; claiming for its slot now
        overlaps the next claim with that write); a thread or process job counts until its outcome is
        written."""
        held = self._registry.held_by_class
        for isolation, gauge in self._busy.items():
            gauge.set(held.get(isolation, 0))
        taken = {c: held.get(c, 0) + self.unavailable(c) for c in self._classes.claimed}
        return classes_free(self._classes.capacities, taken, self._completer.outstanding_by_class,
                            self._classes.claimed)

    async def _wait(self, timeout: float) -> None:
        """Until woken, or `timeout` seconds. Not asyncio.wait_for: on Python 3.11 it waits in a task of
        its own, which puts two more turns of the loop between a NOTIFY and the claim."""
        try:
            async with asyncio.timeout(timeout):
                await self.wake.wait()
        except TimeoutError:
            pass

    def _count(self, jobs: list[ClaimedJob]) -> None:
        claimed: dict[str, int] = {}
        for job in jobs:
            claimed[job.queue] = claimed.get(job.queue, 0) + 1
        for queue, count in claimed.items():  # one labelled increment per queue, not per job
            JOBS_CLAIMED.labels(queue=queue).inc(count)
        JOBS_IN_FLIGHT.set(len(self._registry))
