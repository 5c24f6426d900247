"""Liveness reports to the supervisor, written from the event loop itself (a stuck loop goes silent).

The supervisor passes the write end of a pipe in env TASKQ_SUPERVISOR_FD; the worker writes one JSON
line per report: {"pid", "worker_id", "state": "starting"|"ready"|"draining", "in_flight", "queues"}.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.worker.main import Worker

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""What a supervisor's worker child keeps blocked from the fork (taskq.supervisor.spawn.child_hygiene) until
its event loop handles them (taskq.worker.main.install_signal_handlers unblocks them): a stop that arrives
while the child is still starting (a rolling restart's new worker stopped at once, say) waits for the
handler, and is a clean stop, not a death by SIGTERM's default action."""

ENV_FD = "TASKQ_SUPERVISOR_FD"
REPORT_INTERVAL = 0.5


class LivenessReporter:
    def __init__(self, worker: Worker, fd: int) -> None:
        self.w = worker
        self.fd = fd
        self.parent = os.getppid()
        os.set_blocking(fd, False)

    @classmethod
    def from_env(cls, worker: Worker) -> LivenessReporter | None:
        raw = os.environ.get(ENV_FD)
        if not raw:
            return None
        try:
            return cls(worker, int(raw))
        except (ValueError, OSError):
            return None

    def state(self) -> str:
        if self.w.draining:
            return "draining"
        # ready once LISTEN is up, or once a heartbeat went through (no LISTEN behind a pooler)
        ready = self.w.listener.connected.is_set() or self.w.heartbeat.ticks > 0
        return "ready" if ready else "starting"

    def report(self) -> None:
        line = json.dumps({
            "pid": os.getpid(), "worker_id": self.w.worker_id, "state": self.state(),
            "in_flight": len(self.w.registry), "queues": self.w.settings.queues,
        }) + "\n"
        try:
            os.write(self.fd, line.encode())
        except BlockingIOError:
            pass  # the supervisor is behind; the next report carries the same news
        except OSError:
            pass  # the supervisor is gone; the parent-death check stops us

    async def run(self) -> None:
        interval = min(REPORT_INTERVAL, self.w.settings.worker_timeout / 4)
        while True:
            self.report()
            if os.getppid() != self.parent:  # our supervisor died and we were re-parented
                self.w.request_shutdown()
            await asyncio.sleep(interval)
