"""CancelController: the cancellation ladder of spec §3, driven by the heartbeat.

run_in_tx() runs inside the heartbeat transaction (the escalation write must precede the force with
no await in between); run_post_tx() runs after commit and writes the abandonment verdicts on other
pool connections (inside the transaction they would wait on our own row locks).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection

from taskq.backend.workers import HeldRow
from taskq.metrics import cancellation_phase_transition
from taskq.models import CancelMarker, CancelOrigin, CancelPhase
from taskq.worker.decisions import LADDER_STEPS, observed_phase, phase_due
from taskq.worker.registry import ActiveJob

if TYPE_CHECKING:
    from taskq.backend.workers import WorkerStore
    from taskq.worker.completer import Completer
    from taskq.worker.hooks import Hooks
    from taskq.worker.registry import ActiveJobRegistry
    from taskq.worker.state import WorkerState

log = logging.getLogger("taskq.cancellation")

T = TypeVar("T")

def log_cancel_phase_change(entry: ActiveJob, old: CancelPhase, new: CancelPhase, worker_id: str) -> None:
    """One structured line and one counter increment per ladder transition (spec §10)."""
    pair = (int(old), int(new))
    assert pair in LADDER_STEPS, pair
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
    """`on_abandoned(entry)` is called after each abandonment verdict (the worker frees the slot and counts
    leaked threads)."""

    def __init__(
        self,
        registry: ActiveJobRegistry,
        state: WorkerState,
        store: WorkerStore,
        completer: Completer,
        hooks: Hooks,
        *,
        worker_id: str,
        cancellation_grace_period: float,
        cleanup_grace_period: float,
        on_abandoned: Callable[[ActiveJob], None],
    ) -> None:
        self._registry = registry
        self._state = state
        self._store = store
        self._completer = completer
        self._hooks = hooks
        self._worker_id = worker_id
        self._grace = cancellation_grace_period
        self._cleanup = cleanup_grace_period
        self._on_abandoned = on_abandoned
        self._pending_abandons: list[ActiveJob] = []

    def observe_request(self, entry: ActiveJob, db_phase: int) -> None:
        """Phase 0 -> 1 (or the 0 -> 2 fast-advance) on seeing an operator request; no PG write."""
        if entry.cancel_phase != CancelPhase.NONE or entry.finishing:
            return
        new = observed_phase(CancelPhase.NONE, db_phase)
        assert new is not None, db_phase
        entry.cancel_observed_at = asyncio.get_running_loop().time()
        entry.cancel_phase = new
        entry.request_cancel(CancelOrigin.OPERATOR)
        log_cancel_phase_change(entry, CancelPhase.NONE, new, self._worker_id)

    def on_notification(self, job_id: UUID, attempt: int, epoch: int) -> None:
        """Fast delivery: a NOTIFY for exactly this attempt moves it to COOPERATIVE at once."""
        entry = self._registry.get(job_id)
        if entry is None or entry.attempt != attempt or entry.claim_epoch != epoch:
            return  # a late notification for an older attempt never touches a newer one
        self.observe_request(entry, CancelPhase.COOPERATIVE)

    async def run_in_tx(self, conn: AsyncConnection[Any], flags: dict[UUID, HeldRow]) -> None:
        """`flags`: the rows this worker holds that carry a cancel request, as this tick read them. Only
        those can be on the ladder (a request is never withdrawn), so held jobs without one cost nothing."""
        loop = asyncio.get_running_loop()
        for job_id, row in flags.items():
            entry = self._registry.get(job_id)
            if entry is None or entry.claim_epoch != row.claim_epoch or entry.finishing:
                continue
            seen = observed_phase(entry.cancel_phase, row.cancel_phase)
            if seen is not None and entry.cancel_phase == CancelPhase.NONE:
                self.observe_request(entry, row.cancel_phase)
            elif seen is not None:
                # another worker's heartbeat already escalated: advance without writing or forcing
                log_cancel_phase_change(entry, entry.cancel_phase, seen, self._worker_id)
                entry.cancel_phase = seen
            if entry.cancel_observed_at is None or entry.cancel_origin is not CancelOrigin.OPERATOR:
                continue
            due = phase_due(entry.cancel_phase, loop.time() - entry.cancel_observed_at,
                            grace=self._grace, cleanup=self._cleanup)
            if due is CancelPhase.FORCED:
                escalated = await self._store.escalate_cancel(conn, entry.id, entry.attempt, entry.claim_epoch)
                if escalated:
                    # the write above precedes the force with no await in between
                    entry.cancel_phase = CancelPhase.FORCED
                    entry.force("forced cancel")
                    log_cancel_phase_change(entry, CancelPhase.COOPERATIVE, CancelPhase.FORCED, self._worker_id)
                # never abandon in the tick that escalated: the forced actor gets at least one tick
            elif due is CancelPhase.ABANDON_PENDING:
                entry.cancel_phase = CancelPhase.ABANDON_PENDING
                self._pending_abandons.append(entry)
                log_cancel_phase_change(entry, CancelPhase.FORCED, CancelPhase.ABANDON_PENDING, self._worker_id)

    async def run_post_tx(self) -> None:
        while self._pending_abandons:
            entry = self._pending_abandons.pop(0)
            await shield_with_retrieval(self._write_verdict(entry))

    async def _write_verdict(self, entry: ActiveJob) -> None:
        """The verdict follows the cancel's ownership (spec §3): while the shutdown orchestration runs,
        a held entry gets the operator's own verdict (cancelled, forced); otherwise abandoned."""
        held = entry.id in self._registry
        entry.finishing = True
        try:
            if held and self._state.shutdown_active:
                status = "cancelled"
                written = await self._completer.mark_cancelled(
                    entry.job, CancelMarker.FORCED, "cancelled at phase 2 while the worker was shutting down",
                    {"cancel_phase": 2},
                )
            else:
                status = "abandoned"
                written = await self._completer.mark_abandoned(
                    entry.job,
                    f"the actor did not exit within cancellation_grace_period + cleanup_grace_period "
                    f"({self._grace + self._cleanup:g} s)",
                )
        except Exception as exc:
            log.error("job %s: abandonment verdict not written (%s)", entry.id, exc)
            status, written = "", False
        if entry.executor is not None:
            entry.executor.kill(entry)
        self._registry.remove(entry.id, entry)
        if written and status == "cancelled" and entry.actor and entry.actor.on_cancel:
            await self._hooks.run(entry.actor.on_cancel, entry, entry.actor.on_cancel_timeout, "on_cancel")
        self._on_abandoned(entry)
