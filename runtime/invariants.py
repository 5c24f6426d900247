"""The invariant checker: proves, on any taskq database, that no job was lost or finished twice.

Run it after a chaos run (tests/chaos) or against production with `taskq check`. Each invariant is
one query returning the offending jobs; the report lists them and a summary of what was checked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from psycopg import AsyncConnection

from taskq.backend import invariants as queries

INVARIANTS: dict[str, str] = {
    "inv_stuck_running": "no job lost: no running row with a long-expired lease",
    "inv_terminal_events": "exactly one terminal state change per terminal job",
    "inv_success_from_current_attempt": "a result comes only from the attempt that holds the row",
    "inv_cancel_has_request": "cancelled/abandoned rows carry a real cancel request",
    "inv_abandoned_not_by_shutdown": "shutdown never writes abandoned",
    "inv_attempts_not_refunded": "attempts never refunded: one attempt row per claim, numbered 1..n",
    "inv_interrupts_match_releases": "interrupt_count equals the number of release events",
    "inv_timeline_chained": "timelines non-empty, chained and ordered, ending at the row's status",
    "inv_one_job_per_slot": "at most one job per schedule slot",
    "inv_requeues_have_events": "every requeue has its requeued event",
    "inv_requeue_monotonic": "a requeue never lowers attempt or claim_epoch",
    "inv_unique_key_single_holder": "at most one non-terminal (or retained) job per unique key",
    "inv_snoozes_counted": "every snooze counted on the row, in the timeline and in the attempts",
    "inv_claims_monotonic": "attempt and claim_epoch rise with every claim (through snoozes and requeues)",
    "inv_awaiting_parents_settled": "no awaiting_parents job whose parents are all terminal",
    "inv_parent_failed_has_failed_parent": "a ParentFailed job has a parent that ended other than succeeded",
    "inv_parents_remaining_matches_edges": "a waiting job's remaining-parents count agrees with its edges",
    "inv_global_limit": "no global concurrency limit (queue, actor, per key) is exceeded now",
    "inv_class_capacity": "no worker held more jobs of an isolation class than its capacity",
    "inv_step_by_holder": "no step stored by an attempt other than the one holding the job at that moment",
    "inv_signal_taken_once": "no signal taken twice: each taken signal held by exactly the one wait that took it",
    "inv_suspended_holds_nothing": "no sleeping or signal-waiting job holds a worker or a lease",
}


@dataclass(frozen=True)
class Violation:
    invariant: str
    job_id: UUID
    detail: str


@dataclass
class InvariantReport:
    violations: list[Violation] = field(default_factory=list)
    jobs_by_status: dict[str, int] = field(default_factory=dict)
    executions: dict[int, int] = field(default_factory=dict)
    """Number of claims per job -> number of jobs with that many."""

    @property
    def ok(self) -> bool:
        return not self.violations

    def by_invariant(self) -> dict[str, int]:
        counts = dict.fromkeys(INVARIANTS, 0)
        for v in self.violations:
            counts[v.invariant] += 1
        return counts

    def render(self, extra: dict[str, Any] | None = None) -> str:
        lines = []
        if extra:
            lines.append("run")
            lines += [f"  {k:<40} {v}" for k, v in extra.items()]
        lines.append("jobs by status")
        lines += [f"  {k:<40} {v}" for k, v in sorted(self.jobs_by_status.items())]
        lines.append("claims per job")
        lines += [f"  {k:<40} {v}" for k, v in sorted(self.executions.items())]
        lines.append("invariants (violations)")
        lines += [f"  {INVARIANTS[k]:<75} {n}" for k, n in self.by_invariant().items()]
        for v in self.violations[:50]:
            lines.append(f"  ! {v.invariant} {v.job_id}: {v.detail}")
        if len(self.violations) > 50:
            lines.append(f"  ... and {len(self.violations) - 50} more")
        lines.append(f"violations: {len(self.violations)}")
        return "\n".join(lines)


async def check_invariants(conn: AsyncConnection[Any], *, stale_after: float = 300.0) -> InvariantReport:
    """Run every invariant query. `stale_after`: seconds past lease expiry before a running row counts
    as lost (give the sweepers time)."""
    report = InvariantReport()
    for name, job_id, detail in await queries.violations(conn, INVARIANTS, stale_after=stale_after):
        report.violations.append(Violation(name, job_id, detail))
    report.jobs_by_status = await queries.jobs_by_status(conn)
    report.executions = await queries.executions(conn)
    return report
