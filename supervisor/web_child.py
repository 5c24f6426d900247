"""The web child of `taskq run --web-port`: `taskq web` beside the workers, kept alive like they are.

It is a separate interpreter (a `subprocess` child, the DSN in its environment, never on its command
line), so a crash of the dashboard never touches a worker and a worker's crash never the dashboard. The
supervisor's loop reaps it with the workers (waitpid(-1)) and hands its exit here:

- an unexpected death is logged and the child started again after an exponential backoff (the workers'
  `restart_backoff`, doubling with each death within `crash_window`, at most `restart_backoff_max`). It
  never stops the supervisor: the workers matter more than their dashboard, so there is no crash limit;
- an exit with USAGE (2: for example the port cannot be bound under --no-auth off loopback) or
  MISSING_EXTRA (8: the web extra is not installed) is not retried, because a restart cannot fix it;
  the error is logged once and the workers keep running;
- at the supervisor's stop it gets SIGTERM, then SIGKILL after `timeout`.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("taskq.supervisor")

USAGE = 2
MISSING_EXTRA = 8
IMPORT_ERROR = 10
NOT_RETRIED = frozenset({USAGE, MISSING_EXTRA, IMPORT_ERROR})


def _interpreter_flags() -> list[str]:
    flags: Callable[[], list[str]] | None = getattr(subprocess, "_args_from_interpreter_flags", None)
    return flags() if flags is not None else []


def describe(status: int) -> tuple[int, str]:
    """(exit code, text) of a wait status; killed by a signal: code is -signum."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        return code, f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return code, f"was killed by {name}"


class WebChild:
    def __init__(self, dsn: str, host: str, port: int, *, backoff: float = 0.5, backoff_max: float = 30.0,
                 window: float = 60.0, app: str | None = None) -> None:
        self.dsn = dsn
        self.app = app
        self.host = host
        self.port = port
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.window = window
        self.proc: subprocess.Popen[bytes] | None = None
        self.restart_at: float | None = None
        """When a dead child is started again (monotonic); None while it runs or once given up."""
        self.deaths: deque[float] = deque()
        self.restarts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> None:
        env = os.environ | {"TASKQ_DSN": self.dsn}
        self.proc = subprocess.Popen([sys.executable, *_interpreter_flags(), "-m", "taskq.cli", "web",
                                      "--host", self.host, "--port", str(self.port),
                                      *(("--app", self.app) if self.app else ())], env=env)
        self.restart_at = None
        log.info("web server (pid %d) on http://%s:%d/", self.proc.pid, self.host, self.port)

    def on_exit(self, status: int, now: float, *, stopping: bool) -> None:
        """The supervisor reaped the child (`status` from waitpid): plan its restart, unless the
        supervisor is stopping or the exit says a restart cannot help."""
        assert self.proc is not None
        code, text = describe(status)
        self.proc.returncode = code  # reaped by the supervisor's waitpid(-1), not by Popen
        pid, self.proc = self.proc.pid, None
        if stopping:
            log.log(logging.INFO if code == 0 else logging.WARNING, "web server (pid %d) %s", pid, text)
            return
        if code in NOT_RETRIED:
            log.error("web server (pid %d) %s: not restarted (a restart cannot fix this; see its error "
                      "above); the workers keep running", pid, text)
            return
        self.deaths.append(now)
        while self.deaths and self.deaths[0] <= now - self.window:
            self.deaths.popleft()
        delay = min(self.backoff_max, self.backoff * 2.0 ** (len(self.deaths) - 1))
        self.restart_at = now + delay
        log.error("web server (pid %d) %s; restarting it in %.2fs", pid, text, delay)

    def keep(self, now: float) -> None:
        """Start the child again when its backoff has passed."""
        if self.proc is None and self.restart_at is not None and now >= self.restart_at:
            self.restarts += 1
            try:
                self.start()
            except OSError as exc:  # out of processes or memory, for now
                self.restart_at = now + self.backoff_max
                log.error("cannot start the web server: %s; retrying in %.1fs", exc, self.backoff_max)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; reaps it."""
        proc, self.proc = self.proc, None
        self.restart_at = None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        deadline = time.monotonic() + timeout
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
