"""The heartbeat: one transaction per tick renews this worker's lease (which holds every row it claimed),
learns which rows were taken away from it, reads the cancel flags of the rows with a cancel request, and
runs the cancel controller. Neither its round trips nor its work grow with the number of jobs held; only
a tick that finds the workers row gone checks every held row."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq.backend.workers import HeldRow
from taskq.metrics import JOBS_IN_FLIGHT, heartbeat_failures, heartbeat_tick

if TYPE_CHECKING:
    from taskq.worker.main import Worker

log = logging.getLogger("taskq.heartbeat")

STUCK_TICK_SLACK = 0.05
"""Seconds past its deadline a tick may take to unwind before the self-fence stops waiting for it."""


class Heartbeat:
    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.consecutive_failures = 0
        self.last_success: float | None = None
        self.ticks = 0
        self.tick_durations: list[float] = []
        """Recent tick durations in seconds (bounded), for benchmarks and tests."""
        self._stuck_ticks: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self.last_success = loop.time()
        interval = self.w.settings.heartbeat_interval
        next_tick = loop.time() + interval
        while True:
            # wake at the lease deadline too: a renewal that keeps failing must not outlive the lease
            await asyncio.sleep(max(0.0, min(next_tick, self.lease_deadline()) - loop.time()))
            next_tick += interval
            if next_tick < loop.time():  # fell behind (a long tick): do not burst to catch up
                next_tick = loop.time() + interval
            await self._tick_within_lease()
            if self.w.leases_lost:
                return

    def lease_deadline(self) -> float:
        """When (loop clock) the leases this worker holds run out if no renewal gets through: the start
        of the last successful tick plus lock_timeout. The database computed each lease from its own
        `now()` during that tick, so this is never later than the real expiry."""
        assert self.last_success is not None
        return self.last_success + self.w.settings.lock_timeout

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
        if not len(self.w.registry) or self.last_success is None:
            # nothing held, nothing to lose: a job claimed from now on has a lease of its own from now
            self.last_success = tick_start
        deadline = self.lease_deadline()
        if deadline <= tick_start and self.consecutive_failures == 0:
            # the process was frozen past the deadline (SIGSTOP, a VM pause): ask the database whether the
            # rows are still ours instead of assuming; one interval to answer
            deadline = tick_start + self.w.settings.heartbeat_interval
        return tick_start, deadline

    def _failed(self, exc: BaseException, tick_start: float) -> None:
        self.consecutive_failures += 1
        heartbeat_failures(self.consecutive_failures)
        silent_for = asyncio.get_running_loop().time() - (self.last_success or tick_start)
        reason = "no answer before the lease deadline" if isinstance(exc, TimeoutError) else str(exc)
        log.warning("heartbeat failed (%d in a row, %.1fs since the last renewal): %s",
                    self.consecutive_failures, silent_for, reason)
        if silent_for >= self.w.settings.lock_timeout and len(self.w.registry):
            self.w.lose_leases(f"no lease renewal for {silent_for:.1f}s (lock_timeout "
                               f"{self.w.settings.lock_timeout:g}s)")

    async def _tick(self, tick_start: float, deadline: float) -> None:
        started = time.perf_counter()
        try:
            # a tick still waiting on the database when the leases run out is abandoned: from then on
            # another worker's sweeper may own the rows, and our actors must stop
            async with asyncio.timeout_at(deadline):
                async with self.w.backend.transaction() as conn:
                    read = await self.w.store.heartbeat(conn, self.w.settings.lock_timeout)
                    lost, cancels = (read.lost, read.cancels) if read.worker_row else await self._reconcile(conn)
                    await self.w.controller.run_in_tx(conn, cancels)
            await self.w.controller.run_post_tx()
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
        if self.w.leases_lost:  # an abandoned tick that got through after all: too late to matter
            return
        self.ticks += 1
        JOBS_IN_FLIGHT.set(len(self.w.registry))
        self.last_success = max(tick_start, self.last_success or tick_start)
        if self.consecutive_failures:
            log.info("heartbeat recovered after %d failures", self.consecutive_failures)
        self.consecutive_failures = 0
        heartbeat_failures(0)
        for job_id, epoch in lost:
            entry = self.w.registry.get(job_id)
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
        s = self.w.settings
        await self.w.store.register(s.queues, self.w.concurrency, s.lock_timeout, conn)
        held = self.w.registry.held()
        still = await self.w.store.reconcile(conn, held, s.lock_timeout)  # fenced on the epoch we hold
        cancels = {job_id: row for job_id, row in still.items() if row.cancel_phase > 0}
        return [(job_id, epoch) for job_id, epoch in held if job_id not in still], cancels
