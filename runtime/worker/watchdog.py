"""The shutdown watchdog: an OS thread that hard-exits the process when a stop outlives its budget (the
event loop may be the thing that is stuck, so the loop cannot be the one to notice)."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from taskq.exitcodes import ExitCode
from taskq.worker.decisions import watchdog_remaining

log = logging.getLogger("taskq.worker")


class ShutdownWatchdog:
    """Armed at the first trigger; disarmed only by the worker's own exit path. `describe` names what the
    worker still holds, for the last log line; `clock` is monotonic seconds."""

    def __init__(self, budget: float, describe: Callable[[], object], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._budget = budget
        self._describe = describe
        self._clock = clock
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed_at: float | None = None

    def arm(self) -> None:
        if self._thread is None:
            self._armed_at = self._clock()
            self._thread = threading.Thread(target=self._watch, name="taskq-shutdown-watchdog", daemon=True)
            self._thread.start()

    def remaining(self) -> float:
        """Seconds left before the hard exit (the whole budget while not armed)."""
        return watchdog_remaining(self._budget, self._armed_at, self._clock())

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self) -> None:
        if self._disarmed.wait(self._budget):
            return
        try:
            log.critical("shutdown watchdog: still running after %.1fs; hard exit %d; still held: %s",
                         self._budget, ExitCode.WATCHDOG, self._describe())
        finally:
            os._exit(ExitCode.WATCHDOG)
