"""The heartbeat: one transaction per tick renews this worker's lease (which holds every row it claimed),
learns which rows were taken away from it, reads the cancel flags of the rows with a cancel request, and
runs the cancel controller. Neither its round trips nor its work grow with the number of jobs held; only
a tick that finds the workers row gone checks every held row."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq.backend.workers import HeldRow
from taskq.metrics import JOBS_IN_FLIGHT, heartbeat_failures, heartbeat_tick
from taskq.worker.decisions import lease_deadline, must_self_fence, next_tick_at, tick_window

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.backend.workers import WorkerStore
    from taskq.worker.classes import WorkerClasses
    from taskq.worker.registry import ActiveJobRegistry
    from taskq.worker.state import WorkerState

log = logging.getLogger("taskq.heartbeat")

STUCK_TICK_SLACK = 0.05
"""Seconds past its deadline a tick may take to unwind before the self-fence stops waiting for it."""


InTx = Callable[[AsyncConnection[Any], dict[UUID, HeldRow]], Awaitable[None]]


class Heartbeat:
    """`in_tx(conn, flags)` runs inside each tick's transaction with the cancel flags it read, `post_tx()`
    after its commit (the cancel controller's two halves); `on_leases_lost(why)` when renewals failed for
    lock_timeout while holding jobs (the self-fence)."""

    def __init__(
        self,
        backend: Backend,
        store: WorkerStore,
        registry: ActiveJobRegistry,
        state: WorkerState,
        *,
        queues: Sequence[str],
        classes: WorkerClasses,
        heartbeat_interval: float,
        lock_timeout: float,
        in_tx: InTx,
        post_tx: Callable[[], Awaitable[None]],
        on_leases_lost: Callable[[str], None],
    ) -> None:
        self._backend = backend
        self._store = store
        self._registry = registry
        self._state = state
        self._queues = queues
        self._classes = classes
        self._interval = heartbeat_interval
        self._lock_timeout = lock_timeout
        self._in_tx = in_tx
        self._post_tx = post_tx
        self._on_leases_lost = on_leases_lost
        self.consecutive_failures = 0
        self.last_success: float | None = None
        self.ticks = 0
        self.tick_durations: list[float] = []
        """Recent tick durations in seconds (bounded), for benchmarks and tests."""
        self._stuck_ticks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.last_success = loop.time()
        next_tick = loop.time() + self._interval
        while True:
            # wake at the lease deadline too: a renewal that keeps failing must not outlive the lease
            await asyncio.sleep(max(0.0, min(next_tick, self.lease_deadline()) - loop.time()))
            next_tick = next_tick_at(next_tick, self._interval, loop.time())
            await self._tick_within_lease()
            if self._state.leases_lost:
                return

    def stop(self) -> None:
        """Nothing to stop: every lease must stay valid while the shutdown phases play out."""

    def lease_deadline(self) -> float:
        """When (loop clock) the leases this worker holds run out if no renewal gets through."""
        assert self.last_success is not None
        return lease_deadline(self.last_success, self._lock_timeout)

    async def _tick_within_lease(self) -> None:
        """One tick, whose outcome the self-fence never waits for past the deadline. A tick cancelled at
        the deadline can stay stuck for seconds more while psycopg tries to cancel a query on a server
        that does not answer (hung, or behind a network partition); the actors must stop on time anyway,
        so the stuck tick is left to finish on its own."""
        loop = asyncio.get_running_loop()
        attempt = self._begin_tick()
        task = loop.create_task(self._tick(*attempt), name="taskq-heartbeat-tick")
        try:
            await asyncio.wait({task}, timeout=max(0.0, attempt[1] - loop.time()) + STUCK_TICK_SLACK)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if task.done():
            task.result()
            return
        task.cancel()
        self._stuck_ticks.add(task)
        task.add_done_callback(self._stuck_ticks.discard)
        self._failed(TimeoutError(), attempt[0])

    def stuck_ticks(self) -> list[asyncio.Task[None]]:
        """Ticks given up at the lease deadline that have not finished unwinding yet."""
        return list(self._stuck_ticks)

    async def tick(self) -> None:
        """One heartbeat transaction (renew, poll cancel flags, run the cancel controller)."""
        await self._tick(*self._begin_tick())

    def _begin_tick(self) -> tuple[float, float]:
        """The tick's start and its deadline (loop clock)."""
        tick_start = asyncio.get_running_loop().time()
        self.last_success, deadline = tick_window(
            tick_start, self.last_success, holding=bool(len(self._registry)),
            consecutive_failures=self.consecutive_failures, lock_timeout=self._lock_timeout,
            heartbeat_interval=self._interval,
        )
        return tick_start, deadline

    def _failed(self, exc: BaseException, tick_start: float) -> None:
        self.consecutive_failures += 1
        heartbeat_failures(self.consecutive_failures)
        silent_for = asyncio.get_running_loop().time() - (self.last_success or tick_start)
        reason = "no answer before the lease deadline" if isinstance(exc, TimeoutError) else str(exc)
        log.warning("heartbeat failed (%d in a row, %.1fs since the last renewal): %s",
                    self.consecutive_failures, silent_for, reason)
        if must_self_fence(silent_for, lock_timeout=self._lock_timeout, holding=bool(len(self._registry))):
            self._on_leases_lost(f"no lease renewal for {silent_for:.1f}s (lock_timeout {self._lock_timeout:g}s)")

    async def _tick(self, tick_start: float, deadline: float) -> None:
        started = time.perf_counter()
        try:
            # a tick still waiting on the database when the leases run out is abandoned: from then on
            # another worker's sweeper may own the rows, and our actors must stop
            async with asyncio.timeout_at(deadline):
                async with self._backend.transaction() as conn:
                    read = await self._store.heartbeat(conn, self._lock_timeout)
                    lost, cancels = (read.lost, read.cancels) if read.worker_row else await self._reconcile(conn)
                    await self._in_tx(conn, cancels)
            await self._post_tx()
        except Exception as exc:
            if asyncio.current_task() not in self._stuck_ticks:  # an abandoned tick was counted already
                self._failed(exc, tick_start)
            return
        finally:
            duration = time.perf_counter() - started
            heartbeat_tick(duration)
            self.tick_durations.append(duration)
            if len(self.tick_durations) > 10_000:
                del self.tick_durations[:5_000]
        if self._state.leases_lost:  # an abandoned tick that got through after all: too late to matter
            return
        self.ticks += 1
        JOBS_IN_FLIGHT.set(len(self._registry))
        self.last_success = max(tick_start, self.last_success or tick_start)
        if self.consecutive_failures:
            log.info("heartbeat recovered after %d failures", self.consecutive_failures)
        self.consecutive_failures = 0
        heartbeat_failures(0)
        for job_id, epoch in lost:
            entry = self._registry.get(job_id)
            if entry is not None and entry.claim_epoch == epoch and not entry.finishing:
                # reclaimed by a sweeper or the supervisor, or rewritten by hand: stop locally, never write
                log.warning("job %s attempt %d: lease lost (row no longer held by this attempt); stopping it",
                            entry.id, entry.attempt)
                entry.drop_lease()

    async def _reconcile(
        self, conn: AsyncConnection[Any]
    ) -> tuple[list[tuple[UUID, int]], dict[UUID, HeldRow]]:
        """Our workers row is gone (a sweeper took this worker for dead and cleaned it, its lease losses
        with it): register again with a new lease, then check every held row. Returns the lost ones and
        the cancel flags of the others."""
        log.warning("this worker's row was removed (considered dead by a sweeper); registering again and "
                    "checking every held job")
        classes = self._classes
        await self._store.register(self._queues, classes.capacities["async"], self._lock_timeout, conn,
                                   capacities=classes.capacities, actor_isolation=classes.actors)
        held = self._registry.held()
        still = await self._store.reconcile(conn, held, self._lock_timeout)  # fenced on the epoch we hold
        cancels = {job_id: row for job_id, row in still.items() if row.cancel_phase > 0}
        return [(job_id, epoch) for job_id, epoch in held if job_id not in still], cancels
