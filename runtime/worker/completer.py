"""Batches attempt outcomes into one fenced statement per flush (PERFORMANCE.md lesson 1)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any
from uuid import UUID

from taskq.backend.workers import ClaimedJob, Finish, WorkerStore
from taskq.metrics import STALE_WRITES
from taskq.models import CancelMarker

log = logging.getLogger("taskq.worker")

MAX_BATCH = 500


class Completer:
    """Consumers hand their outcome to `finish()`; one loop writes whatever has queued up meanwhile.
    A write that fails (database down) is retried until `give_up_after` seconds, then reported as
    not written: the lease then expires and the sweeper decides, never a guess here.

    `outstanding` counts the outcomes handed over and not yet written (queued or in the statement in
    flight). An actor that has returned no longer needs its slot while its outcome waits here, so the
    dispatcher may claim for it meanwhile (at most `concurrency` such outcomes): the next claim then
    overlaps this write instead of waiting for it. `on_queued` is called after each hand-over, `on_written`
    after each batch written (its slots are free in the database then).

    `outstanding_by_class` splits `outstanding` by isolation class, `class_of(job id)` telling the class of
    each outcome handed over (its job is still held then; a worker of one class passes none, and every
    outcome counts on `single`, and nothing is counted per class for it); `on_queued(class)` is told it."""

    def __init__(self, store: WorkerStore, *, give_up_after: float,
                 on_queued: Callable[[str], None] | None = None, on_written: Callable[[], None] | None = None,
                 class_of: Callable[[UUID], str] | None = None, single: str = "async") -> None:
        self._store = store
        self._give_up_after = give_up_after
        self._on_queued = on_queued
        self._on_written = on_written
        self._class_of = class_of
        self._single = single
        self.outstanding = 0
        self._by_class: dict[str, int] = {}
        self._queue: list[tuple[Finish, asyncio.Future[str | None], str]] = []
        self._wake = asyncio.Event()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def finish(self, item: Finish) -> str | None:
        """Queue one outcome and wait for its write: the status written, or None when the fence did not
        hold (the row was not changed). A retry written over an operator's cancel request is 'cancelled'.

        A caller cancelled while it waits cancels only its own wait: the outcome stays queued and is
        written anyway (the future it awaited is simply not resolved)."""
        # once per worker, not per job: get_running_loop() costs a getpid() system call each time
        loop = self._loop or self._bind_loop()
        future: asyncio.Future[str | None] = loop.create_future()
        if self._class_of is None:
            isolation = self._single
        else:
            isolation = self._class_of(item.job_id)
            self._by_class[isolation] = self._by_class.get(isolation, 0) + 1
        self._queue.append((item, future, isolation))
        self.outstanding += 1
        self._wake.set()
        if self._on_queued is not None:
            self._on_queued(isolation)
        return await future

    @property
    def outstanding_by_class(self) -> dict[str, int]:
        """`outstanding` per isolation class."""
        if self._class_of is None:
            return {self._single: self.outstanding}
        return self._by_class

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        self._loop = asyncio.get_running_loop()
        return self._loop

    async def mark_cancelled(
        self, job: ClaimedJob, marker: CancelMarker, message: str, detail: dict[str, Any] | None = None
    ) -> bool:
        """The spec's mark_cancelled: fenced, and refused by the database unless an operator's cancel
        request is on the row. True if it changed the row."""
        return None is not await self.finish(Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="cancelled",
            outcome="cancelled", error_class=marker.value, error_message=message, detail=detail,
        ))

    async def mark_abandoned(self, job: ClaimedJob, message: str) -> bool:
        """The spec's mark_abandoned: the holder ignored the cancel past both graces (CancelAbandoned)."""
        return None is not await self.finish(Finish(
            job_id=job.id, attempt=job.attempt, claim_epoch=job.claim_epoch, status="abandoned",
            outcome="abandoned", error_class=CancelMarker.ABANDONED.value, error_message=message,
            detail={"cancel_phase": 2},
        ))

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                batch = self._queue[:MAX_BATCH]
                del self._queue[:MAX_BATCH]
                await self._write(batch)

    def stop(self) -> None:
        """Nothing to stop: outcomes are written until the exit, which drains what is left."""

    async def drain(self) -> None:
        """Write everything queued, from the caller's task (used at exit)."""
        while self._queue:
            batch = self._queue[:MAX_BATCH]
            del self._queue[:MAX_BATCH]
            await self._write(batch)

    async def _write(self, batch: list[tuple[Finish, asyncio.Future[str | None], str]]) -> None:
        try:
            await self._write_once(batch)
        finally:
            self.outstanding -= len(batch)
            if self._class_of is not None:
                by_class = self._by_class
                for _, _, isolation in batch:
                    by_class[isolation] -= 1

    async def _write_once(self, batch: list[tuple[Finish, asyncio.Future[str | None], str]]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._give_up_after
        delay = 0.05
        while True:
            try:
                # bounded by the deadline itself: the pool alone would wait its own timeout per attempt
                async with asyncio.timeout_at(deadline):
                    written = await self._store.finish_batch([item for item, _, _ in batch])
                break
            except Exception as exc:
                if isinstance(exc, TimeoutError):
                    exc = TimeoutError(f"the database did not answer within {self._give_up_after:g}s")
                if loop.time() + delay > deadline:
                    log.error("giving up writing %d outcomes after %.1fs: %s", len(batch), self._give_up_after, exc)
                    for _, future, _ in batch:
                        if not future.done():
                            future.set_exception(exc)
                    return
                log.warning("writing %d outcomes failed (%s); retrying in %.2fs", len(batch), exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        for item, future, _ in batch:
            status = written.get(item.job_id)
            if status is None:
                STALE_WRITES.inc()
                log.warning(
                    "stale write ignored: job %s attempt %d epoch %d (%s) no longer belongs to this attempt",
                    item.job_id, item.attempt, item.claim_epoch, item.status,
                )
            if not future.done():
                future.set_result(status)
        if self._on_written is not None:
            self._on_written()
