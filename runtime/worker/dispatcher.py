"""The dispatcher claims batches up to the free slots; the listener wakes it on NOTIFY and delivers
cancel requests in milliseconds. Polling every `poll_interval` is the fallback for both."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING
from uuid import UUID

import psycopg

from taskq.backend import CANCEL_CHANNEL, JOBS_CHANNEL
from taskq.backend.notify import open_listener
from taskq.backend.queues import QUEUES_CHANNEL
from taskq.metrics import JOBS_CLAIMED, JOBS_IN_FLIGHT, LIMITED_CLAIMS
from taskq.worker.resolver import SETTLE_CHANNEL

if TYPE_CHECKING:
    from taskq.backend.workers import ClaimedJob
    from taskq.worker.main import Worker

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


class Dispatcher:
    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self.wake = asyncio.Event()
        self.busy_poll = BUSY_POLL
        self.full = False
        """Waiting for a free slot (every one of `concurrency` is taken), not for new jobs."""

    async def run(self) -> None:
        s = self.w.settings
        loop = asyncio.get_running_loop()
        backoff = 0.05
        lingering = BUSY_POLLS  # empty claims in a row since the busy poll found jobs (BUSY_POLLS: off)
        while not self.w.draining:
            free = self.free_slots()
            if free <= 0:
                self.wake.clear()
                self.full = True
                try:
                    await self.wake.wait()
                finally:
                    self.full = False
                continue
            want = min(free, s.claim_batch_size)
            try:
                jobs = await self.claim(want)
            except Exception as exc:
                log.warning("claim failed: %s (retrying in %.2fs)", exc, backoff)
                # a NOTIFY (the listener is back, so is the database) cuts the backoff short
                self.wake.clear()
                await self._wait(backoff)
                backoff = min(backoff * 2, s.poll_interval)
                continue
            backoff = 0.05
            if self.w.draining:  # stop arrived during the claim: run nothing new, give the rows back
                await self.w.release_unstarted(jobs)
                return
            for job in jobs:
                self.w.consumers.spawn(job)
            if jobs:
                # counted after the new consumers' first steps, which start the actors
                loop.call_soon(self._count, jobs)
            if len(jobs) < want:
                if len(jobs) > 1 or (jobs and lingering < BUSY_POLLS):
                    lingering = 0
                elif lingering < BUSY_POLLS:
                    lingering += 1
                busy = lingering < BUSY_POLLS
                await self._wait(min(self.busy_poll, s.poll_interval) if busy else s.poll_interval)
                self.wake.clear()

    async def claim(self, want: int) -> list[ClaimedJob]:
        """Limited work first (it takes at most what its limits leave), then the plain claim for the rest;
        each only when the worker's view of queue control says it may find something."""
        s = self.w.settings
        control = self.w.control
        await control.refresh_if_due()
        jobs: list[ClaimedJob] = []
        if control.limited:
            jobs = await self.w.store.claim_limited(s.queues, want, s.lock_timeout,
                                                    queue_limits_only=control.queue_limits_only)
            LIMITED_CLAIMS.labels(result="jobs" if jobs else "empty").inc()
        if control.plain and len(jobs) < want:
            jobs += await self.w.store.claim(s.queues, want - len(jobs), s.lock_timeout)
        return jobs

    def free_slots(self) -> int:
        """Slots for new claims: `concurrency` minus the jobs whose actors have not returned yet. A job
        whose outcome waits in the completer does not count (its actor is done; claiming for its slot
        now overlaps the next claim with that write), but at most `concurrency` of those are held, so
        a worker never holds more than twice `concurrency` rows."""
        held = len(self.w.registry)
        concurrency = self.w.concurrency
        outstanding = self.w.completer.outstanding
        return min(concurrency - held + outstanding, 2 * concurrency - held)

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
        JOBS_IN_FLIGHT.set(len(self.w.registry))


class Listener:
    """A dedicated LISTEN connection that reconnects by itself."""

    def __init__(self, worker: Worker, dsn: str) -> None:
        self.w = worker
        self.dsn = dsn
        self.connected = asyncio.Event()

    async def run(self) -> None:
        backoff = 0.1
        queues = set(self.w.settings.queues)
        while True:
            try:
                conn = await open_listener(self.dsn)
                async with conn:
                    self.connected.set()
                    backoff = 0.1
                    self.w.control.invalidate()  # a pause or limit change made while we were away
                    self.w.dispatcher.wake.set()  # anything enqueued while we were away
                    self.w.resolver.wake.set()  # a backlog written while we were away
                    async for note in conn.notifies():
                        if note.channel == JOBS_CHANNEL:
                            if note.payload in queues:
                                self.w.dispatcher.wake.set()
                        elif note.channel == CANCEL_CHANNEL:
                            self._on_cancel(note.payload)
                        elif note.channel == SETTLE_CHANNEL:
                            self.w.resolver.wake.set()
                        elif note.channel == QUEUES_CHANNEL:
                            if note.payload in queues or note.payload == "*":
                                self.w.control.invalidate()
                                self.w.dispatcher.wake.set()
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def _on_cancel(self, payload: str) -> None:
        try:
            job_id, attempt, epoch, worker_id = payload.split(":", 3)
            if worker_id != self.w.worker_id:
                return
            self.w.controller.on_notification(UUID(job_id), int(attempt), int(epoch))
        except ValueError:
            log.warning("ignoring malformed cancel notification %r", payload)
