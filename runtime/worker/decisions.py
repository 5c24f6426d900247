"""The worker's decisions that need no database: pure functions of what they are given. A clock is never
read here; the caller passes its reading (`now`, `elapsed`), so tests/unit/test_worker_decisions.py checks
each one in microseconds.

- the cancellation ladder (spec §3): which phase a read of the database or the passing of time moves a
  held job to;
- slot arithmetic: how many jobs of each isolation class the dispatcher may claim, and how soon it claims
  again;
- lease deadlines: until when the worker may trust its leases, and when it must fence itself off;
- shutdown budgets: how long each last step of a stop may take before the watchdog fires.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from taskq.models import CancelOrigin, CancelPhase

# -- the cancellation ladder -------------------------------------------------------------------------

LADDER_STEPS = frozenset({(0, 1), (1, 2), (2, 3), (0, 2)})
"""The transitions of the in-process ladder: NONE -> COOPERATIVE -> FORCED -> ABANDON_PENDING, and the
fast advance NONE -> FORCED when another worker already escalated."""


def observed_phase(local: CancelPhase, db_phase: int) -> CancelPhase | None:
    """The phase a held job moves to when its row reads `db_phase`, or None when it stays. A request
    (db_phase >= 1) moves NONE to COOPERATIVE, or straight to FORCED when another worker's heartbeat has
    escalated already (db_phase 2); that escalation also moves COOPERATIVE to FORCED. Neither move
    writes anything or forces the actor: the escalating worker did both."""
    if local == CancelPhase.NONE and db_phase >= CancelPhase.COOPERATIVE:
        return CancelPhase.FORCED if db_phase >= CancelPhase.FORCED else CancelPhase.COOPERATIVE
    if local == CancelPhase.COOPERATIVE and db_phase >= CancelPhase.FORCED:
        return CancelPhase.FORCED
    return None


def phase_due(phase: CancelPhase, elapsed: float, *, grace: float, cleanup: float) -> CancelPhase | None:
    """The phase an operator's cancel is due to move to, `elapsed` seconds after this worker observed it:
    FORCED once `grace` has passed (escalate, then force), ABANDON_PENDING once `grace + cleanup` have;
    None when nothing is due."""
    if phase == CancelPhase.COOPERATIVE:
        return CancelPhase.FORCED if elapsed > grace else None
    if phase == CancelPhase.FORCED and elapsed >= grace + cleanup:
        return CancelPhase.ABANDON_PENDING
    return None


def phase_at_shutdown_force(origin: CancelOrigin | None, phase: CancelPhase) -> CancelPhase:
    """The phase a held job takes when the shutdown forces it: an operator's cancel becomes a forced
    cancel (its verdict reads phase 2); any other job keeps its phase."""
    if origin is CancelOrigin.OPERATOR and phase < CancelPhase.FORCED:
        return CancelPhase.FORCED
    return phase


# -- slot arithmetic ----------------------------------------------------------------------------------


def free_slots(concurrency: int, held: int, outstanding: int) -> int:
    """Slots for new claims: `concurrency` minus the jobs whose actors have not returned yet. A held job
    whose outcome waits in the completer (`outstanding`) does not count, but at most `concurrency` of
    those are held, so a worker never holds more than twice `concurrency` rows."""
    return min(concurrency - held + outstanding, 2 * concurrency - held)


def claim_size(free: int, claim_batch_size: int) -> int:
    """Jobs one claim asks for."""
    return min(free, claim_batch_size)


def class_free_slots(isolation: str, capacity: int, held: int, outstanding: int) -> int:
    """Slots of one isolation class for new claims. Async: `free_slots` (a job whose outcome waits in the
    completer lends its slot to the next claim, which then overlaps that write). Thread and process:
    `capacity` minus every held job of the class, outcome written or not (`outstanding` is not counted):
    a thread or a child is a real resource, the job costs far more than one round trip, and so the rows
    of these classes a worker holds never exceed its capacity (what inv_class_capacity checks)."""
    if isolation == "async":
        return free_slots(capacity, held, outstanding)
    return capacity - held


def classes_free(capacities: Mapping[str, int], held: Mapping[str, int], outstanding: Mapping[str, int],
                 classes: Iterable[str]) -> dict[str, int]:
    """`class_free_slots` of each of `classes` (the classes a worker claims for), never below 0."""
    return {c: max(0, class_free_slots(c, capacities[c], held.get(c, 0), outstanding.get(c, 0)))
            for c in classes}


def class_claim_sizes(free: Mapping[str, int], claim_batch_size: int) -> dict[str, int]:
    """Jobs one claim asks for, per class: the class's free slots, at most `claim_batch_size`; a class
    with no free slot is left out (its jobs are not claimed at all)."""
    return {c: min(n, claim_batch_size) for c, n in free.items() if n > 0}


def leftover(sizes: Mapping[str, int], taken: Mapping[str, int]) -> dict[str, int]:
    """What is left of `sizes` after a first claim took `taken` jobs of each class (classes with nothing
    left are left out)."""
    left = {c: n - taken.get(c, 0) for c, n in sizes.items()}
    return {c: n for c, n in left.items() if n > 0}


def strays_due(last: float | None, now: float, poll_interval: float) -> bool:
    """Whether a mixed worker looks for jobs of actors it does not know (job_claim_strays) in this claim:
    at most once per `poll_interval` (`last`: when it last did, None: never)."""
    return last is None or now - last >= poll_interval


def lingering_after(lingering: int, found: int, *, busy_polls: int) -> int:
    """After a claim that found fewer jobs than it asked for: the empty claims in a row since the busy
    poll last found jobs (`busy_polls`: the busy poll is off). It starts when a claim finds more than one
    job (one NOTIFY covered several), or any job while it is on, and stops after `busy_polls` claims in a
    row found none."""
    if found > 1 or (found and lingering < busy_polls):
        return 0
    if lingering < busy_polls:
        return lingering + 1
    return lingering


def claim_pause(lingering: int, *, busy_polls: int, busy_poll: float, poll_interval: float) -> float:
    """Seconds until the next claim (unless a NOTIFY comes first) after a claim that found fewer jobs
    than it asked for: `busy_poll` while the busy poll is on, else `poll_interval`."""
    return min(busy_poll, poll_interval) if lingering < busy_polls else poll_interval


# -- lease deadlines ----------------------------------------------------------------------------------


def lease_deadline(last_success: float, lock_timeout: float) -> float:
    """When the leases run out if no renewal gets through: the start of the last successful heartbeat
    plus lock_timeout. The database computed each lease from its own now() during that tick, so this is
    never later than the real expiry."""
    return last_success + lock_timeout


def confirm_before_start(claim_sent: float | None, now: float, lock_timeout: float) -> bool:
    """Whether a claimed job's actor may start only after the database confirms the row is still ours: half
    its claim's lease or more has passed since the claim was sent (the process was frozen, or its event loop
    blocked, between the claim and the start). Before that no sweeper can have taken the row, whose claim
    lock runs at least lock_timeout from the claim; from then on it may have, and an actor started on a row
    already reclaimed would run after the job ended elsewhere (its writes fenced, its effects not)."""
    return claim_sent is not None and now - claim_sent >= lock_timeout / 2


def tick_window(now: float, last_success: float | None, *, holding: bool, consecutive_failures: int,
                lock_timeout: float, heartbeat_interval: float) -> tuple[float, float]:
    """A heartbeat tick starting at `now`: the last success it counts from, and its deadline. Holding
    nothing there is nothing to lose: a job claimed from now on has a lease of its own from now. A
    deadline already past with no failure means the process was frozen (SIGSTOP, a VM pause): the tick
    asks the database whether the rows are still ours, one interval to answer, instead of assuming."""
    if not holding or last_success is None:
        last_success = now
    deadline = lease_deadline(last_success, lock_timeout)
    if deadline <= now and consecutive_failures == 0:
        deadline = now + heartbeat_interval
    return last_success, deadline


def next_tick_at(scheduled: float, heartbeat_interval: float, now: float) -> float:
    """The tick after the one `scheduled`: one interval on, or one interval from `now` when the worker
    fell behind (a long tick) rather than burst to catch up."""
    following = scheduled + heartbeat_interval
    return now + heartbeat_interval if following < now else following


def must_self_fence(silent_for: float, *, lock_timeout: float, holding: bool) -> bool:
    """No renewal for `silent_for` seconds: past lock_timeout while holding jobs, another worker's
    sweeper may own them now, so this worker stops its actors without writing."""
    return holding and silent_for >= lock_timeout


# -- shutdown budgets ---------------------------------------------------------------------------------

POOL_RECONNECT_TIMEOUT = 10.0
"""Seconds of an outage for which the worker's pool keeps reconnecting in the background, about once a
second (backend._conn.SteadyRetry); past that its own requests (heartbeat, claim) keep trying. It gets
connections back within about a second of the end of an outage either way."""
LOST_LEASES_FINAL_STEP_BUDGET = 2.0
"""Seconds each final database step (writes, deregistration) may take once the database stopped answering,
at most: never more than leaves the exit EXIT_MARGIN before the shutdown watchdog."""
EXIT_MARGIN = 1.0
"""Seconds of the watchdog's budget kept for the exit itself (closing the pool, reaping, logging)."""
MIN_STEP_BUDGET = 0.1


def watchdog_remaining(budget: float, armed_at: float | None, now: float) -> float:
    """Seconds left before the watchdog's hard exit (the whole budget while it is not armed)."""
    if armed_at is None:
        return budget
    return budget - (now - armed_at)


def step_budget(watchdog_left: float) -> float:
    """Seconds for one last database step once the database is in doubt: LOST_LEASES_FINAL_STEP_BUDGET,
    or less as the watchdog's deadline nears, so that the steps together end before it fires."""
    return max(MIN_STEP_BUDGET, min(LOST_LEASES_FINAL_STEP_BUDGET, watchdog_left - EXIT_MARGIN))


def settle_budget(*, in_doubt: bool, watchdog_left: float) -> float:
    """Seconds the stop waits for releases already being written: as long as a release write may wait
    (release_budget: the pool's reconnection series while the database answers, one step once it is in
    doubt), ending EXIT_MARGIN before the watchdog fires. A slow but healthy database (a loaded machine
    releasing thousands of rows) is waited for: the rows it gives back are not reported as still held."""
    if in_doubt:
        return step_budget(watchdog_left)
    return max(MIN_STEP_BUDGET, min(POOL_RECONNECT_TIMEOUT, watchdog_left - EXIT_MARGIN))


def db_in_doubt(*, leases_lost: bool, unreleased: int, heartbeat_failures: int) -> bool:
    """The database did not answer lately (the leases were lost, a release failed, heartbeats fail): the
    exit path gives each last step a short budget."""
    return leases_lost or unreleased > 0 or heartbeat_failures > 0


def release_budget(*, in_doubt: bool, step: float) -> float:
    """Seconds a release may wait: with the database gone the pool would wait its own timeout for a
    connection, past the end of the stop; otherwise one pool reconnection series."""
    return step if in_doubt else POOL_RECONNECT_TIMEOUT
