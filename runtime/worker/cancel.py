"""CancelController: the cancellation ladder of spec §3, driven by the heartbeat.

run_in_tx() runs inside the heartbeat transaction (the escalation write must precede the force with
no await in between); run_post_tx() runs after commit and writes the abandonment verdicts on other
pool connections (inside the transaction they would wait on our own row locks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection

from taskq.backend.workers import HeldRow
from taskq.metrics import cancellation_phase_transition
from taskq.models import CancelMarker, CancelOrigin, CancelPhase
from taskq.worker.registry import ActiveJob

if TYPE_CHECKING:
    from taskq.worker.main import Worker

log = logging.getLogger("taskq.cancellation")

T = TypeVar("T")

VALID_TRANSITIONS = frozenset({(0, 1), (1, 2), (2, 3), (0, 2)})


def log_cancel_phase_change(entry: ActiveJob, old: CancelPhase, new: CancelPhase, worker_id: str) -> None:
    """One structured line and one counter increment per ladder transition (spec §10)."""
    pair = (int(old), int(new))
    assert pair in VALID_TRANSITIONS, pair
    cancellation_phase_transition(str(pair[0]), str(pair[1]))
    log.info(
        "cancel phase %d -> %d for job %s attempt %d",
        pair[0], pair[1], entry.id, entry.attempt,
        extra={"job_id": str(entry.id), "attempt": entry.attempt, "from_phase": pair[0], "to_phase": pair[1],
               "worker_id": worker_id, "cancel_origin": str(entry.cancel_origin)},
    )


async def shield_with_retrieval(aw: Awaitable[T]) -> T:
    """Await `aw` so that cancelling the caller does not cancel it; if the caller is cancelled anyway,
    the shielded task's outcome is still retrieved (no "exception was never retrieved")."""
    task = asyncio.ensure_future(aw)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: None if t.cancelled() else t.exception())
        raise


class CancelController:
    def __init__(self, worker: Worker) -> None:
        self.w = worker
        self._pending_abandons: list[ActiveJob] = []

    def observe_request(self, entry: ActiveJob, db_phase: int) -> None:
        """Phase 0 -> 1 (or the 0 -> 2 fast-advance) on seeing an operator request; no PG write."""
        if entry.cancel_phase != CancelPhase.NONE or entry.finishing:
            return
        loop = asyncio.get_running_loop()
        new = CancelPhase.FORCED if db_phase >= CancelPhase.FORCED else CancelPhase.COOPERATIVE
        entry.cancel_observed_at = loop.time()
        entry.cancel_phase = new
        entry.request_cancel(CancelOrigin.OPERATOR)
        log_cancel_phase_change(entry, CancelPhase.NONE, new, self.w.worker_id)

    def on_notification(self, job_id: UUID, attempt: int, epoch: int) -> None:
        """Fast delivery: a NOTIFY for exactly this attempt moves it to COOPERATIVE at once."""
        entry = self.w.registry.get(job_id)
        if entry is None or entry.attempt != attempt or entry.claim_epoch != epoch:
            return  # a late notification for an older attempt never touches a newer one
        self.observe_request(entry, CancelPhase.COOPERATIVE)

    async def run_in_tx(self, conn: AsyncConnection[Any], flags: dict[UUID, HeldRow]) -> None:
        """`flags`: the rows this worker holds that carry a cancel request, as this tick read them. Only
        those can be on the ladder (a request is never withdrawn), so held jobs without one cost nothing."""
        loop = asyncio.get_running_loop()
        grace = self.w.settings.cancellation_grace_period
        cleanup = self.w.settings.cleanup_grace_period
        for job_id, row in flags.items():
            entry = self.w.registry.get(job_id)
            if entry is None or entry.claim_epoch != row.claim_epoch or entry.finishing:
                continue
            if row.cancel_phase >= 1 and entry.cancel_phase == CancelPhase.NONE:
                self.observe_request(entry, row.cancel_phase)
            elif row.cancel_phase >= 2 and entry.cancel_phase == CancelPhase.COOPERATIVE:
                # another worker's heartbeat already escalated: advance without writing or forcing
                entry.cancel_phase = CancelPhase.FORCED
                log_cancel_phase_change(entry, CancelPhase.COOPERATIVE, CancelPhase.FORCED, self.w.worker_id)
            if entry.cancel_observed_at is None or entry.cancel_origin is not CancelOrigin.OPERATOR:
                continue
            elapsed = loop.time() - entry.cancel_observed_at
            if entry.cancel_phase == CancelPhase.COOPERATIVE and elapsed > grace:
                escalated = await self.w.store.escalate_cancel(conn, entry.id, entry.attempt, entry.claim_epoch)
                if escalated:
                    # the write above precedes the force with no await in between
                    entry.cancel_phase = CancelPhase.FORCED
                    entry.force("forced cancel")
                    log_cancel_phase_change(entry, CancelPhase.COOPERATIVE, CancelPhase.FORCED, self.w.worker_id)
                # never abandon in the tick that escalated: the forced actor gets at least one tick
                continue
            if entry.cancel_phase == CancelPhase.FORCED and elapsed >= grace + cleanup:
                entry.cancel_phase = CancelPhase.ABANDON_PENDING
                self._pending_abandons.append(entry)
                log_cancel_phase_change(entry, CancelPhase.FORCED, CancelPhase.ABANDON_PENDING, self.w.worker_id)

    async def run_post_tx(self) -> None:
        while self._pending_abandons:
            entry = self._pending_abandons.pop(0)
            await shield_with_retrieval(self._write_verdict(entry))

    async def _write_verdict(self, entry: ActiveJob) -> None:
        """The verdict follows the cancel's ownership (spec §3): while the shutdown orchestration runs,
        a held entry gets the operator's own verdict (cancelled, forced); otherwise abandoned."""
        s = self.w.settings
        held = entry.id in self.w.registry
        entry.finishing = True
        try:
            if held and self.w.shutdown_active:
                status = "cancelled"
                written = await self.w.completer.mark_cancelled(
                    entry.job, CancelMarker.FORCED, "cancelled at phase 2 while the worker was shutting down",
                    {"cancel_phase": 2},
                )
            else:
                status = "abandoned"
                written = await self.w.completer.mark_abandoned(
                    entry.job,
                    f"the actor did not exit within cancellation_grace_period + cleanup_grace_period "
                    f"({s.cancellation_grace_period + s.cleanup_grace_period:g} s)",
                )
        except Exception as exc:
            log.error("job %s: abandonment verdict not written (%s)", entry.id, exc)
            status, written = "", False
        if entry.executor is not None:
            entry.executor.kill(entry)
        self.w.registry.remove(entry.id, entry)
        if written and status == "cancelled" and entry.actor and entry.actor.on_cancel:
            await self.w.hooks.run(entry.actor.on_cancel, entry, entry.actor.on_cancel_timeout, "on_cancel")
        self.w.on_abandoned(entry)
