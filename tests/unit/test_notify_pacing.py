"""The rule that decides which enqueue gets a NOTIFY (backend_notify.NotifyPacing), on the real clock: a
quiet queue's insert carries its own, a busy queue's window doubles with each NOTIFY up to the widest, and
a pause brings it back. The elapsed time between calls is the input under test, so the gaps are slept;
each is far from the bound it is compared with."""

from __future__ import annotations

import time

from taskq.backend.notify import NOTIFY_WINDOW, NOTIFY_WINDOW_MAX, NotifyPacing


def test_the_defaults_notify_every_job_at_fifty_a_second_and_at_most_twenty_a_second_when_busy() -> None:
    assert NOTIFY_WINDOW < 1 / 50  # the light load of benchmarks/latency.py: every insert is quiet
    assert 1 / NOTIFY_WINDOW_MAX <= 20


def test_a_busy_queues_window_doubles_with_each_notify_up_to_the_widest() -> None:
    pacing = NotifyPacing(window=30.0, max_window=100.0)
    assert pacing.quiet("q"), "the first insert of a queue carries its NOTIFY"
    assert not pacing.quiet("q"), "the next, at once, is a busy queue's"
    assert not pacing.send_now("q", pending=False), "the quiet insert's NOTIFY went within the window"
    assert pacing.span("q") == 30.0
    at = time.monotonic()
    pacing.sent("q", at)
    assert (pacing.span("q"), pacing.due("q")) == (60.0, at + 60.0)
    pacing.sent("q", at)
    assert pacing.span("q") == 100.0
    pacing.sent("q", at)
    assert pacing.span("q") == 100.0, "the window stops at max_window"
    assert pacing.span("other") == 30.0, "each queue has its own window"


def test_a_waiting_notify_covers_the_insert_and_an_overdue_one_goes_at_once() -> None:
    pacing = NotifyPacing(window=0.0, max_window=0.0)
    pacing.quiet("q")
    assert not pacing.send_now("q", pending=True)
    assert pacing.send_now("q", pending=False)


def test_one_long_gap_in_a_busy_stream_is_not_quiet_two_are_and_so_is_a_pause() -> None:
    pacing = NotifyPacing(window=0.1, max_window=5.0)
    pacing.quiet("q")
    assert not pacing.quiet("q")
    pacing.sent("q", time.monotonic())
    assert pacing.span("q") == 0.2
    time.sleep(0.15)
    assert not pacing.quiet("q"), "one gap over the window after a busy one: still busy"
    time.sleep(0.15)
    assert pacing.quiet("q"), "a second gap over the window: quiet, the insert notifies"
    assert pacing.span("q") == 0.1, "a quiet insert narrows the window back"
    assert not pacing.quiet("q")
    pacing.sent("q", time.monotonic())
    pacing.max_window = 0.3
    time.sleep(0.35)
    assert pacing.quiet("q"), "a pause of max_window after a busy insert: quiet"
    assert pacing.span("q") == 0.1
