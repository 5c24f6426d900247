"""The supervisor's pure decisions: restart backoff, crash loops, boot failures, liveness parsing, titles."""

from __future__ import annotations

import argparse
import json
import os
import signal

import pytest

from taskq.supervisor.main import _explicit_settings, _options, add_run_arguments
from taskq.supervisor.proctitle import supervisor_title, worker_title
from taskq.supervisor.restart import RestartPolicy
from taskq.supervisor.workers import WorkerProc
from taskq.worker import exitcodes

pytestmark = pytest.mark.timeout(10)


def test_backoff_doubles_per_recent_death_up_to_its_cap() -> None:
    policy = RestartPolicy(crash_limit=10, crash_window=60, backoff=0.5, backoff_max=3)
    assert [policy.record_death(float(t), 1) for t in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_crash_limit_deaths_within_the_window_is_a_crash_loop() -> None:
    policy = RestartPolicy(crash_limit=3, crash_window=10, backoff=0.1)
    assert policy.record_death(0.0, 1) is not None
    assert policy.record_death(1.0, -9) is not None
    assert policy.record_death(2.0, 1) is None


def test_deaths_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy(crash_limit=3, crash_window=10, backoff=0.1)
    policy.record_death(0.0, 1)
    policy.record_death(1.0, 1)
    assert policy.record_death(11.5, 1) == 0.1  # both fell out of the window: a first death again


def test_a_worker_restarting_itself_for_leaked_threads_is_not_a_crash() -> None:
    policy = RestartPolicy(crash_limit=1, crash_window=60)
    assert policy.record_death(0.0, exitcodes.LEAKED_THREADS) == 0.0
    assert not policy.deaths


def test_workers_the_database_outage_ended_are_replaced_without_a_crash_loop() -> None:
    """A failover with no primary for longer than lock_timeout: every worker self-fences (LEASES_LOST) and
    their replacements find no primary for a while (DATABASE_UNAVAILABLE): waited out, never a crash loop."""
    from taskq.supervisor.restart import OUTAGE_BACKOFF_MAX

    policy = RestartPolicy(crash_limit=3, crash_window=60, backoff=0.5, backoff_max=30)
    codes = [exitcodes.LEASES_LOST] * 3 + [exitcodes.DATABASE_UNAVAILABLE] * 20
    recorded = [policy.record_death(float(t), code) for t, code in enumerate(codes)]
    delays = [d for d in recorded if d is not None]
    assert len(delays) == len(recorded) and not policy.deaths
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0] and max(delays) == OUTAGE_BACKOFF_MAX  # (under backoff_max)
    policy.worker_ready()  # the database is back: the next outage starts from the first delay
    assert policy.record_death(100.0, exitcodes.LEASES_LOST) == 0.5
    # a crash still counts
    assert policy.record_death(101.0, 1) is not None


@pytest.mark.parametrize("code", [exitcodes.USAGE, exitcodes.SCHEMA, exitcodes.EMBEDDED_UNAVAILABLE,
                                  exitcodes.IMPORT_ERROR])
def test_configuration_exit_codes_at_boot_are_fatal_always(code: int) -> None:
    policy = RestartPolicy()
    assert policy.is_boot_failure(code, ever_ready=False, supervisor_was_ready=False)
    assert policy.is_boot_failure(code, ever_ready=False, supervisor_was_ready=True)
    assert not policy.is_boot_failure(code, ever_ready=True, supervisor_was_ready=True)


def test_an_unreachable_database_is_fatal_only_before_the_supervisor_was_ready() -> None:
    policy = RestartPolicy()
    code = exitcodes.DATABASE_UNAVAILABLE
    assert policy.is_boot_failure(code, ever_ready=False, supervisor_was_ready=False)
    assert not policy.is_boot_failure(code, ever_ready=False, supervisor_was_ready=True)


@pytest.mark.parametrize(
    "code", [exitcodes.ERROR, exitcodes.LEASES_LOST, exitcodes.WATCHDOG, -signal.SIGKILL]
)
def test_other_deaths_are_never_boot_failures(code: int) -> None:
    assert not RestartPolicy().is_boot_failure(code, ever_ready=False, supervisor_was_ready=False)


def _worker() -> WorkerProc:
    return WorkerProc(number=3, pid=4242, worker_id="h:4242:abc", fd=None, spawned_at=0.0, last_seen=0.0)


def _report(**fields: object) -> bytes:
    return json.dumps({"pid": 4242, "worker_id": "h:4242:abc", "state": "ready", "in_flight": 0,
                       "queues": ["default"]} | fields).encode() + b"\n"


def test_the_latest_complete_report_wins_and_a_partial_line_waits() -> None:
    wp = _worker()
    wp.feed(_report(state="starting") + _report(in_flight=4) + b'{"pid": 4242, "sta', now=5.0)
    assert (wp.state, wp.in_flight, wp.ever_ready, wp.last_seen) == ("ready", 4, True, 5.0)
    wp.feed(b'te": "draining", "in_flight": 1}\n', now=6.0)
    assert (wp.state, wp.in_flight, wp.last_seen) == ("draining", 1, 6.0)


def test_garbage_and_reports_from_another_pid_do_not_count_as_liveness() -> None:
    wp = _worker()
    wp.feed(b"not json\n" + _report(pid=1) + b"[1, 2]\n", now=9.0)
    assert (wp.state, wp.last_seen) == ("booting", 0.0)


def test_exits_are_described_with_the_signal_name_and_silence() -> None:
    wp = _worker()
    assert wp.describe_exit(exitcodes.IMPORT_ERROR << 8) == (10, "exited with code 10")
    wp.silent_for = 2.25
    code, text = wp.describe_exit(signal.SIGABRT)
    assert code == -signal.SIGABRT
    assert text == "was silent for 2.2s (worker_timeout) and was killed by SIGABRT"
    assert os.waitstatus_to_exitcode(signal.SIGKILL) == -signal.SIGKILL


def test_titles_carry_counts_and_queues_only() -> None:
    assert supervisor_title(2, 5, "app:actors") == "taskq supervisor [2 workers, 5 in flight] app:actors"
    stopping = supervisor_title(1, 0, "app:actors", "stopping")
    assert stopping == "taskq supervisor [1 worker, 0 in flight] stopping app:actors"
    assert worker_title(3, ["default", "mail"], 4) == "taskq worker 3 [q=default,mail, 4 running]"
    assert worker_title(3, ["default"], 0, draining=True) == "taskq worker 3 [q=default, 0 running, draining]"


def test_run_arguments_leave_a_global_dsn_flag_to_the_host_cli() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", default=None)
    add_run_arguments(parser)  # would raise on a second --dsn
    args = parser.parse_args(["app:actors", "--dsn", "host=/x password=p", "--workers", "3",
                              "--queues", "a,b", "--crash-limit", "7", "--no-preload"])
    assert _explicit_settings(args) == {"dsn": "host=/x password=p", "queues": "a,b"}
    options = _options(args)
    assert (options.app, options.workers, options.crash_limit, options.preload) == ("app:actors", 3, 7, False)
    assert options.crash_window == 60.0


def test_run_arguments_define_dsn_when_the_host_cli_does_not() -> None:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    args = parser.parse_args(["app:actors", "--dsn", "host=/y"])
    assert _explicit_settings(args) == {"dsn": "host=/y"}
    assert _options(args).workers >= 1


def test_reclaims_back_off_together_while_the_database_is_unreachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from taskq.exceptions import DatabaseUnavailable
    from taskq.supervisor import reclaim

    calls: list[str] = []
    up = False

    def fake_reclaim(dsn: str, worker_id: str, **kwargs: object) -> dict[str, int]:
        calls.append(worker_id)
        if not up:
            raise DatabaseUnavailable("cannot connect")
        return {"scheduled": 1}

    monkeypatch.setattr(reclaim, "reclaim_dead_worker", fake_reclaim)
    r = reclaim.Reclaimer("dsn", "supervisor:h:1", give_up_after=30)
    r.reclaim("w1", "worker_died", "was killed by SIGKILL", now=0.0)
    r.reclaim("w2", "worker_died", "exited with code 1", now=0.1)  # inside the back-off: not tried
    assert calls == ["w1"] and r.next_try() == 1.0
    r.retry_due(1.0)
    assert calls == ["w1", "w1"] and r.next_try() == 3.0  # one failure per round, delay doubled
    up = True
    r.retry_due(3.0)
    assert calls == ["w1", "w1", "w1", "w2"] and r.pending == [] and r.next_try() is None


def test_a_final_flush_tries_once_and_then_leaves_the_rest_to_lock_expiry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from taskq.exceptions import DatabaseUnavailable
    from taskq.supervisor import reclaim

    calls: list[str] = []

    def down(dsn: str, worker_id: str, **kwargs: object) -> dict[str, int]:
        calls.append(worker_id)
        raise DatabaseUnavailable("cannot connect")

    monkeypatch.setattr(reclaim, "reclaim_dead_worker", down)
    r = reclaim.Reclaimer("dsn", "supervisor:h:1", give_up_after=30)
    for n in range(4):
        r.reclaim(f"w{n}", "worker_died", "exited with code 0", now=0.0)
    r.flush(now=0.5)
    assert calls == ["w0", "w0"] and r.pending == []


def test_metrics_dirs_of_dead_supervisors_are_removed_and_live_ones_kept(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from taskq.supervisor.metrics_http import DIR_PREFIX, fresh_metrics_dir

    base = Path(str(tmp_path))
    monkeypatch.setenv("RUNTIME_DIRECTORY", str(base))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    (base / f"{DIR_PREFIX}{int(dead.stdout)}-abc").mkdir()
    (base / f"{DIR_PREFIX}1-abc").mkdir()  # pid 1 is alive
    (base / "unrelated").mkdir()
    fresh = Path(fresh_metrics_dir())
    assert fresh.parent == base and fresh.name.startswith(f"{DIR_PREFIX}{os.getpid()}-")
    assert sorted(p.name for p in base.iterdir()) == sorted([fresh.name, f"{DIR_PREFIX}1-abc", "unrelated"])
