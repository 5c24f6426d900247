"""The release: interrupted attempts go back to the fleet (`pending`, or `scheduled` behind a hold), their
attempt refunded and progress kept; a row an operator asked to cancel ends cancelled (forced) instead,
through the same fenced write the unwinding consumer races (spec §4, RELEASING)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

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
    `unreleased`."""

    def __init__(self, store: WorkerStore, state: WorkerState, hooks: Hooks, *,
                 budget: Callable[[], float]) -> None:
        self._store = store
        self._state = state
        self._hooks = hooks
        self._budget = budget

    async def release(self, entries: Sequence[ActiveJob]) -> None:
        """Give interrupted attempts back to the fleet; a row an operator asked to cancel ends
        cancelled (forced) instead, through the same fenced write the unwinding consumer races."""
        state = self._state
        todo = [e for e in entries if not (e.finishing and e.cancel_origin is CancelOrigin.LEASE_LOST)]
        if not todo:
            return
        for e in todo:
            e.finishing = True
        ids = [str(e.id) for e in todo]
        state.releasing.update(ids)
        # bounded: with the database gone, the pool would wait its own timeout for a connection, past the
        # end of the stop, and a release still waiting when the stop ends is a job the summary would miss
        budget = self._budget()
        try:
            outcome = await asyncio.wait_for(
                self._store.release_batch([(e.id, e.attempt, e.claim_epoch) for e in todo],
                                          [e.effect_unknown for e in todo]),
                budget,
            )
        except BaseException as exc:  # a cancelled release (the exit path) gave nothing back either
            # nothing more to try before the exit: the rows stay held until their lease runs out, then any
            # sweeper retries them (the attempt counts, as for a crash)
            state.unreleased += ids
            state.exit_code = ExitCode.LEASES_LOST
            log.error("could not release %d jobs (%s): left to the sweeper once their lease runs out",
                      len(todo), str(exc) or type(exc).__name__)
            if not isinstance(exc, Exception):
                raise
            return
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
                if e.actor is not None and e.actor.on_cancel is not None:
                    await self._hooks.run(e.actor.on_cancel, e, e.actor.on_cancel_timeout, "on_cancel")
            else:
                state.summary["released"].append(str(e.id))

    async def release_unstarted(self, jobs: Sequence[ClaimedJob]) -> None:
        """Rows claimed after the stop began: given back before any actor ran."""
        await self.release([ActiveJob(job=j) for j in jobs])
