"""The release: interrupted attempts go back to the fleet (`pending`, or `scheduled` behind a hold), their
attempt refunded and progress kept; a row an operator asked to cancel ends cancelled (forced) instead,
through the same fenced write the unwinding consumer races (spec §4, RELEASING)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq.exitcodes import ExitCode
from taskq.metrics import STALE_WRITES
from taskq.models import CancelOrigin
from taskq.worker.registry import ActiveJob

if TYPE_CHECKING:
    from taskq.backend.workers import ClaimedJob, WorkerStore
    from taskq.worker.hooks import Hooks
    from taskq.worker.state import WorkerState

log = logging.getLogger("taskq.worker")


class Releaser:
    """`budget()`: seconds one release may wait for the database now (short once it is in doubt). The
    outcome of each release lands in the state's summary; what could not be given back in its
    `unreleased`.

    Releases are batched: a stop interrupts every held job at once, and each consumer that unwinds asks for
    its own job's release. One writer task takes whatever has been asked for and writes it in one statement
    (up to BATCH rows), then the next lot; a caller waits for its lot. The write belongs to the writer, not
    to the caller: a consumer cancelled while it waits (the teardown of a worker whose task was cancelled)
    does not take its job's release down with it."""

    BATCH = 1000
    """Rows per release statement."""
    RECHECK = 0.1
    """Seconds between two looks at the budget while a release waits."""

    def __init__(self, store: WorkerStore, state: WorkerState, hooks: Hooks, *,
                 budget: Callable[[], float]) -> None:
        self._store = store
        self._state = state
        self._hooks = hooks
        self._budget = budget
        self._asked: list[tuple[ActiveJob, asyncio.Future[str | None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def release(self, entries: Sequence[ActiveJob]) -> None:
        """Give interrupted attempts back to the fleet; a row an operator asked to cancel ends
        cancelled (forced) instead, through the same fenced write the unwinding consumer races."""
        state = self._state
        todo = [e for e in entries if not (e.finishing and e.cancel_origin is CancelOrigin.LEASE_LOST)]
        if not todo:
            return
        loop = asyncio.get_running_loop()
        waits = []
        for e in todo:
            e.finishing = True
            state.releasing.add(str(e.id))
            fut: asyncio.Future[str | None] = loop.create_future()
            self._asked.append((e, fut))
            waits.append(fut)
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write_asked(), name="taskq-release")
        # shielded: the release is written whether or not this caller is still there to see it
        outcomes = await asyncio.shield(asyncio.gather(*waits))
        for e, status in zip(todo, outcomes, strict=True):
            if status == "cancelled" and e.actor is not None and e.actor.on_cancel is not None:
                await self._hooks.run(e.actor.on_cancel, e, e.actor.on_cancel_timeout, "on_cancel")

    async def settled(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for every release asked for to be written (or given up)."""
        writer = self._writer
        if writer is None or writer.done():
            return True
        done, _ = await asyncio.wait({writer}, timeout=timeout)
        return bool(done)

    async def _write_asked(self) -> None:
        await asyncio.sleep(0)  # the other consumers unwinding in this turn of the loop join the first lot
        while self._asked:
            lot, self._asked = self._asked[: self.BATCH], self._asked[self.BATCH :]
            try:
                outcome = await self._write([e for e, _ in lot])
            except BaseException:
                for _, fut in lot:
                    if not fut.done():
                        fut.set_result(None)
                for _, fut in self._asked:  # the writer itself is cancelled: nothing more goes out
                    if not fut.done():
                        fut.set_result(None)
                self._asked = []
                raise
            for e, fut in lot:
                if not fut.done():
                    fut.set_result(outcome.get(e.id) if outcome is not None else None)

    async def _write(self, todo: list[ActiveJob]) -> dict[UUID, str] | None:
        """One release statement; None when it failed (the rows stay held until their lease runs out)."""
        state = self._state
        ids = [str(e.id) for e in todo]
        # bounded: with the database gone, the pool would wait its own timeout for a connection, past the
        # end of the stop, and a release still waiting when the stop ends is a job the summary would miss
        try:
            outcome = await self._within_budget(
                self._store.release_batch([(e.id, e.attempt, e.claim_epoch) for e in todo],
                                          [e.effect_unknown for e in todo]))
        except BaseException as exc:
            # nothing more to try before the exit: the rows stay held until their lease runs out, then any
            # sweeper retries them (the attempt counts, as for a crash)
            state.unreleased += ids
            state.exit_code = ExitCode.LEASES_LOST
            log.error("could not release %d jobs (%s): left to the sweeper once their lease runs out",
                      len(todo), str(exc) or type(exc).__name__)
            if not isinstance(exc, Exception):
                raise
            return None
        finally:
            state.releasing.difference_update(ids)
            if not state.releasing:
                state.releases_settled.set()
        for e in todo:
            status = outcome.get(e.id)
            if status is None:
                STALE_WRITES.inc()
                log.warning("job %s attempt %d: release fenced out (a newer attempt owns the row)", e.id, e.attempt)
            elif status == "crashed":
                state.summary["crashed"].append(str(e.id))
                log.warning("job %s attempt %d: a non-idempotent actor had to be forced at shutdown; ended crashed "
                            "(WorkerShutdown) for review instead of being re-run", e.id, e.attempt)
            elif status == "cancelled":
                state.summary["cancelled"].append(str(e.id))
            else:
                state.summary["released"].append(str(e.id))
        return outcome

    async def _within_budget(self, write: Coroutine[Any, Any, dict[UUID, str]]) -> dict[UUID, str]:
        """Await `write` while it has been waiting less than budget() seconds. The budget is asked again as
        the write waits: a release that began while the database looked healthy (the pool's reconnection
        series) gives up as soon as the worker learns the database is gone (a few seconds), so the stop still
        ends before its watchdog."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        task = loop.create_task(write)
        try:
            while True:
                left = started + self._budget() - loop.time()
                if left <= 0:
                    raise TimeoutError(f"no answer in {loop.time() - started:.1f}s")
                done, _ = await asyncio.wait({task}, timeout=min(left, self.RECHECK))
                if done:
                    return task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def abandon(self) -> None:
        """The stop is ending: a release still waiting for the database is given up (its rows are left to
        the sweeper and recorded as not released)."""
        writer = self._writer
        if writer is not None and not writer.done():
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)

    async def release_unstarted(self, jobs: Sequence[ClaimedJob]) -> None:
        """Rows claimed after the stop began: given back before any actor ran."""
        await self.release([ActiveJob(job=j) for j in jobs])
