"""taskq_supervisor_app's actors behind an import that waits: it writes the file named by
TASKQ_TEST_IMPORTING, then waits (up to 60 s) for the file named by TASKQ_TEST_GATE. With --no-preload a
worker imports this after the fork, so a test can hold a worker child before its event loop exists."""

from __future__ import annotations

import os
import time
from pathlib import Path

Path(os.environ["TASKQ_TEST_IMPORTING"]).write_text(str(os.getpid()))
_deadline = time.monotonic() + 60
while not Path(os.environ["TASKQ_TEST_GATE"]).exists() and time.monotonic() < _deadline:
    time.sleep(0.01)  # the import under test is this wait

from taskq_supervisor_app import actors  # noqa: E402

__all__ = ["actors"]
