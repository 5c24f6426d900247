"""The worker's decisions that need no database (taskq.worker.decisions), and the small pieces built on
them that run without one: the shutdown watchdog's clock, the listener's routes, the dispatcher's wake."""

from __future__ import annotations

import asyncio
from uuid import UUID, uuid4

import pytest

from taskq.models import CancelOrigin, CancelPhase
from taskq.worker.decisions import (
    EXIT_MARGIN,
    LADDER_STEPS,
    LOST_LEASES_FINAL_STEP_BUDGET,
    MIN_STEP_BUDGET,
    POOL_RECONNECT_TIMEOUT,
    claim_pause,
    claim_size,
    confirm_before_start,
    db_in_doubt,
    free_slots,
    lease_deadline,
    lingering_after,
    must_self_fence,
    next_tick_at,
    observed_phase,
    phase_at_shutdown_force,
    phase_due,
    release_budget,
    settle_budget,
    step_budget,
    tick_window,
    watchdog_remaining,
)
from taskq.worker.dispatcher import ClaimWake
from taskq.worker.listener import cancel_route, queue_route, wake_route
from taskq.worker.state import WorkerState
from taskq.worker.watchdog import ShutdownWatchdog

pytestmark = pytest.mark.timeout(10)

NONE, COOPERATIVE, FORCED, ABANDON = (CancelPhase.NONE, CancelPhase.COOPERATIVE, CancelPhase.FORCED,
                                      CancelPhase.ABANDON_PENDING)


# -- the cancellation ladder -------------------------------------------------------------------------


def test_a_cancel_request_moves_a_running_job_to_cooperative() -> None:
    assert observed_phase(NONE, 1) is COOPERATIVE


def test_a_row_another_worker_escalated_moves_straight_to_forced() -> None:
    assert observed_phase(NONE, 2) is FORCED
    assert observed_phase(COOPERATIVE, 2) is FORCED


def test_a_read_that_brings_nothing_new_leaves_the_phase_alone() -> None:
    assert observed_phase(NONE, 0) is None
    assert observed_phase(COOPERATIVE, 1) is None
    assert observed_phase(FORCED, 2) is None
    assert observed_phase(ABANDON, 2) is None  # never persisted: the database cannot move it back


def test_every_move_the_ladder_makes_is_one_of_its_steps() -> None:
    moves = {(int(local), int(moved)) for local in CancelPhase for db in (0, 1, 2)
             if (moved := observed_phase(local, db)) is not None}
    moves |= {(int(phase), int(due)) for phase in CancelPhase for elapsed in (0.0, 10.0, 100.0)
              if (due := phase_due(phase, elapsed, grace=5.0, cleanup=5.0)) is not None}
    assert moves <= LADDER_STEPS
    assert moves == LADDER_STEPS


def test_escalation_is_due_only_once_the_grace_has_strictly_passed() -> None:
    assert phase_due(COOPERATIVE, 30.0, grace=30.0, cleanup=10.0) is None
    assert phase_due(COOPERATIVE, 30.001, grace=30.0, cleanup=10.0) is FORCED


def test_abandonment_is_due_once_both_graces_have_passed() -> None:
    assert phase_due(FORCED, 39.9, grace=30.0, cleanup=10.0) is None
    assert phase_due(FORCED, 40.0, grace=30.0, cleanup=10.0) is ABANDON


def test_a_cooperative_cancel_past_both_graces_escalates_first_and_never_skips_to_abandon() -> None:
    assert phase_due(COOPERATIVE, 1000.0, grace=30.0, cleanup=10.0) is FORCED


def test_nothing_is_due_before_a_request_or_after_the_abandonment() -> None:
    assert phase_due(NONE, 1000.0, grace=1.0, cleanup=1.0) is None
    assert phase_due(ABANDON, 1000.0, grace=1.0, cleanup=1.0) is None


def test_the_shutdown_force_makes_an_operator_cancel_a_forced_one() -> None:
    assert phase_at_shutdown_force(CancelOrigin.OPERATOR, NONE) is FORCED
    assert phase_at_shutdown_force(CancelOrigin.OPERATOR, COOPERATIVE) is FORCED
    assert phase_at_shutdown_force(CancelOrigin.OPERATOR, ABANDON) is ABANDON


def test_the_shutdown_force_leaves_the_phase_of_other_origins_alone() -> None:
    for origin in (None, CancelOrigin.SHUTDOWN, CancelOrigin.TIMEOUT, CancelOrigin.LEASE_LOST):
        assert phase_at_shutdown_force(origin, NONE) is NONE


# -- slot arithmetic ----------------------------------------------------------------------------------


def test_free_slots_are_concurrency_minus_the_actors_still_running() -> None:
    assert free_slots(10, held=0, outstanding=0) == 10
    assert free_slots(10, held=4, outstanding=0) == 6
    assert free_slots(10, held=4, outstanding=3) == 9  # three of the four only wait for their write


def test_a_worker_never_holds_more_than_twice_its_concurrency() -> None:
    assert free_slots(10, held=15, outstanding=10) == 5
    assert free_slots(10, held=20, outstanding=15) == 0
    assert free_slots(10, held=12, outstanding=0) == -2  # over (a claim raced a stop): nothing to claim


def test_one_claim_asks_for_the_free_slots_up_to_the_batch_size() -> None:
    assert claim_size(3, 100) == 3
    assert claim_size(500, 100) == 100


def test_the_busy_poll_starts_when_one_claim_finds_several_jobs() -> None:
    assert lingering_after(3, 2, busy_polls=3) == 0
    assert lingering_after(3, 1, busy_polls=3) == 3  # one job: one NOTIFY brought it, no busy poll


def test_the_busy_poll_goes_on_while_claims_find_jobs_and_stops_after_empty_ones() -> None:
    lingering = lingering_after(3, 5, busy_polls=3)
    lingering = lingering_after(lingering, 1, busy_polls=3)
    assert lingering == 0
    pauses = []
    for _ in range(4):
        lingering = lingering_after(lingering, 0, busy_polls=3)
        pauses.append(claim_pause(lingering, busy_polls=3, busy_poll=0.01, poll_interval=1.0))
    assert pauses == [0.01, 0.01, 1.0, 1.0]


def test_the_busy_poll_never_waits_longer_than_the_poll_interval() -> None:
    assert claim_pause(0, busy_polls=3, busy_poll=2.0, poll_interval=0.5) == 0.5


# -- lease deadlines ----------------------------------------------------------------------------------


def test_the_leases_run_out_lock_timeout_after_the_last_successful_tick_began() -> None:
    assert lease_deadline(100.0, 30.0) == 130.0


def test_a_tick_holding_jobs_counts_from_the_last_success() -> None:
    assert tick_window(110.0, 100.0, holding=True, consecutive_failures=0, lock_timeout=30.0,
                       heartbeat_interval=10.0) == (100.0, 130.0)


def test_a_tick_holding_nothing_counts_from_now() -> None:
    assert tick_window(500.0, 100.0, holding=False, consecutive_failures=3, lock_timeout=30.0,
                       heartbeat_interval=10.0) == (500.0, 530.0)
    assert tick_window(7.0, None, holding=True, consecutive_failures=0, lock_timeout=30.0,
                       heartbeat_interval=10.0) == (7.0, 37.0)


def test_a_frozen_process_asks_the_database_for_one_interval_instead_of_assuming_the_leases_lost() -> None:
    assert tick_window(200.0, 100.0, holding=True, consecutive_failures=0, lock_timeout=30.0,
                       heartbeat_interval=10.0) == (100.0, 210.0)


def test_a_failing_heartbeat_keeps_the_passed_deadline() -> None:
    assert tick_window(200.0, 100.0, holding=True, consecutive_failures=2, lock_timeout=30.0,
                       heartbeat_interval=10.0) == (100.0, 130.0)


def test_ticks_keep_their_rhythm_and_a_late_one_does_not_make_them_burst() -> None:
    assert next_tick_at(100.0, 10.0, 101.0) == 110.0
    assert next_tick_at(100.0, 10.0, 135.0) == 145.0


def test_the_worker_fences_itself_off_once_silent_for_lock_timeout_while_holding_jobs() -> None:
    assert not must_self_fence(29.9, lock_timeout=30.0, holding=True)
    assert must_self_fence(30.0, lock_timeout=30.0, holding=True)
    assert not must_self_fence(300.0, lock_timeout=30.0, holding=False)


# -- shutdown budgets ---------------------------------------------------------------------------------


def test_an_unarmed_watchdog_has_its_whole_budget_left() -> None:
    assert watchdog_remaining(30.0, None, 1000.0) == 30.0
    assert watchdog_remaining(30.0, 990.0, 1000.0) == 20.0


def test_a_last_step_gets_the_lost_leases_budget_while_the_watchdog_is_far() -> None:
    assert step_budget(60.0) == LOST_LEASES_FINAL_STEP_BUDGET


def test_a_last_step_ends_exit_margin_before_the_watchdog() -> None:
    assert step_budget(2.5) == pytest.approx(2.5 - EXIT_MARGIN)


def test_a_last_step_always_gets_a_minimal_budget() -> None:
    assert step_budget(0.5) == MIN_STEP_BUDGET
    assert step_budget(-10.0) == MIN_STEP_BUDGET


def test_the_database_is_in_doubt_after_lost_leases_a_failed_release_or_failing_heartbeats() -> None:
    assert not db_in_doubt(leases_lost=False, unreleased=0, heartbeat_failures=0)
    assert db_in_doubt(leases_lost=True, unreleased=0, heartbeat_failures=0)
    assert db_in_doubt(leases_lost=False, unreleased=2, heartbeat_failures=0)
    assert db_in_doubt(leases_lost=False, unreleased=0, heartbeat_failures=1)


def test_a_release_waits_a_reconnection_series_unless_the_database_is_in_doubt() -> None:
    assert release_budget(in_doubt=False, step=0.7) == POOL_RECONNECT_TIMEOUT
    assert release_budget(in_doubt=True, step=0.7) == 0.7


def test_the_stop_waits_for_releases_being_written_as_long_as_a_release_may_wait() -> None:
    # healthy database: a release write's own budget, not the in-doubt step's, ending before the watchdog
    assert settle_budget(in_doubt=False, watchdog_left=60.0) == POOL_RECONNECT_TIMEOUT
    assert settle_budget(in_doubt=False, watchdog_left=5.0) == pytest.approx(5.0 - EXIT_MARGIN)
    assert settle_budget(in_doubt=False, watchdog_left=0.5) == MIN_STEP_BUDGET
    # in doubt: one last step
    assert settle_budget(in_doubt=True, watchdog_left=60.0) == LOST_LEASES_FINAL_STEP_BUDGET
    assert settle_budget(in_doubt=True, watchdog_left=2.5) == pytest.approx(2.5 - EXIT_MARGIN)


def test_the_watchdog_counts_its_budget_from_its_arming_on_the_injected_clock() -> None:
    now = [100.0]
    watchdog = ShutdownWatchdog(3600.0, lambda: [], clock=lambda: now[0])
    assert watchdog.remaining() == 3600.0
    watchdog.arm()
    try:
        now[0] = 160.0
        assert watchdog.remaining() == 3540.0
        now[0] = 200.0
        watchdog.arm()  # armed once: a second trigger does not restart the budget
        assert watchdog.remaining() == 3500.0
    finally:
        watchdog.disarm()


# -- the listener's routes and the dispatcher's wake -------------------------------------------------


def test_a_cancel_notification_reaches_the_controller_only_for_this_worker() -> None:
    got: list[tuple[UUID, int, int]] = []
    route = cancel_route("w1", lambda job_id, attempt, epoch: got.append((job_id, attempt, epoch)))
    job = uuid4()
    route(f"{job}:2:7:w1")
    route(f"{job}:2:7:w2")
    assert got == [(job, 2, 7)]


def test_a_malformed_cancel_notification_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    got: list[object] = []
    route = cancel_route("w1", lambda *args: got.append(args))
    route("not-a-uuid:x:y:w1")
    route("too:few")
    assert got == [] and "malformed cancel notification" in caplog.text


def test_a_queue_notification_wakes_only_for_this_workers_queues() -> None:
    woken: list[str] = []
    route = queue_route(["a", "b"], lambda: woken.append("first"), lambda: woken.append("second"), any_queue="*")
    route("c")
    route("a")
    route("*")
    assert woken == ["first", "second", "first", "second"]
    plain = queue_route(["a"], lambda: woken.append("plain"))
    plain("*")
    assert woken.count("plain") == 0


def test_a_wake_route_runs_whatever_the_payload() -> None:
    woken: list[int] = []
    wake_route(lambda: woken.append(1))("anything")
    assert woken == [1]


class _Control:
    limited = False


def test_a_freed_slot_wakes_the_dispatcher_only_when_it_waits_for_one_or_the_worker_drains() -> None:
    state = WorkerState()
    control = _Control()
    wake = ClaimWake(state, control)  # type: ignore[arg-type]
    wake.slot_freed()
    assert not wake.event.is_set()  # the dispatcher waits for jobs, not slots: no empty claim
    wake.full = {"async"}
    wake.slot_freed()
    assert wake.event.is_set()
    wake.event.clear()
    wake.full = set()
    state.draining = True
    wake.slot_freed()
    assert wake.event.is_set()


def test_a_written_finish_wakes_the_dispatcher_only_under_limits() -> None:
    control = _Control()
    wake = ClaimWake(WorkerState(), control)  # type: ignore[arg-type]
    wake.limited_slot_freed()
    assert not wake.event.is_set()
    control.limited = True
    wake.limited_slot_freed()
    assert wake.event.is_set()


def test_worker_state_starts_clean() -> None:
    state = WorkerState()
    assert (state.draining, state.shutdown_active, state.leases_lost, state.exit_code) == (False, False, False, 0)
    assert state.summary == {"released": [], "cancelled": [], "crashed": [], "held": []}
    assert isinstance(state.releases_settled, asyncio.Event)
    assert state.summary is not WorkerState().summary


def test_an_actor_starts_unchecked_until_half_its_claims_lease_has_passed() -> None:
    assert not confirm_before_start(100.0, 100.0, 30.0)
    assert not confirm_before_start(100.0, 114.9, 30.0)
    assert confirm_before_start(100.0, 115.0, 30.0)
    assert confirm_before_start(100.0, 200.0, 30.0)
    assert not confirm_before_start(None, 1e9, 30.0)  # a job no dispatcher claimed (no claim time)
