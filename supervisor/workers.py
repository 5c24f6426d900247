"""The supervisor's view of one worker process: identity, liveness reports, and the stop it was sent."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field


@dataclass
class WorkerProc:
    number: int
    """1, 2, 3... in spawn order; a replacement gets a new number."""
    pid: int
    worker_id: str
    fd: int | None
    spawned_at: float
    last_seen: float
    state: str = "booting"
    """booting (no report yet) | starting | ready | draining, as the worker last reported."""
    in_flight: int = 0
    queues: list[str] = field(default_factory=list)
    ever_ready: bool = False
    retiring: str | None = None
    """Why the supervisor asked it to stop (then it is not replaced): 'rolling restart', 'scale down'..."""
    term_sent_at: float | None = None
    stop_deadline: float | None = None
    abort_sent_at: float | None = None
    kill_sent_at: float | None = None
    silent_for: float | None = None
    """Set when it was killed for going silent: how long it had been silent."""
    _buffer: bytes = b""

    @property
    def active(self) -> bool:
        """Counted as capacity: alive and not asked to stop."""
        return self.retiring is None

    def feed(self, data: bytes, now: float) -> None:
        """Consume liveness bytes; only the latest complete report matters."""
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in reversed(lines):
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if not isinstance(report, dict) or report.get("pid") not in (None, self.pid):
                continue
            self.last_seen = now
            self.state = str(report.get("state", self.state))
            self.in_flight = int(report.get("in_flight", 0) or 0)
            self.queues = [str(q) for q in report.get("queues") or self.queues]
            if self.state == "ready":
                self.ever_ready = True
            return

    def send(self, sig: int) -> bool:
        """Signal the process; False if it is already gone (not yet reaped is fine: it is our child)."""
        try:
            os.kill(self.pid, sig)
        except ProcessLookupError:
            return False
        return True

    def describe_exit(self, status: int) -> tuple[int, str]:
        """(exit code, human text). Killed by a signal: code is -signum."""
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            text = f"was killed by {name}"
        else:
            text = f"exited with code {code}"
        if self.silent_for is not None:
            text = f"was silent for {self.silent_for:.1f}s (worker_timeout) and {text}"
        return code, text
