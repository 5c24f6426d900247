"""Liveness reports to the supervisor, written from the event loop itself (a stuck loop goes silent).

The supervisor passes the write end of a pipe in env TASKQ_SUPERVISOR_FD; the worker writes one JSON
line per report: {"pid", "worker_id", "state": "starting"|"ready"|"draining", "in_flight", "queues"}.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from taskq.worker.registry import ActiveJobRegistry
    from taskq.worker.state import WorkerState

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})
"""What a supervisor's worker child keeps blocked from the fork (taskq.supervisor.spawn.child_hygiene) until
its event loop handles them (taskq.worker.main.install_signal_handlers unblocks them): a stop that arrives
while the child is still starting (a rolling restart's new worker stopped at once, say) waits for the
handler, and is a clean stop, not a death by SIGTERM's default action."""

ENV_FD = "TASKQ_SUPERVISOR_FD"
REPORT_INTERVAL = 0.5


class LivenessReporter:
    """`ready()` says whether the worker is up (LISTEN connected, or a heartbeat went through); a report
    while the worker drains says `draining`. `on_orphaned()` when the supervisor died (the worker stops)."""

    def __init__(self, fd: int, *, worker_id: str, queues: Sequence[str], worker_timeout: float,
                 registry: ActiveJobRegistry, state: WorkerState, ready: Callable[[], bool],
                 on_orphaned: Callable[[], None]) -> None:
        self.fd = fd
        self._worker_id = worker_id
        self._queues = queues
        self._worker_timeout = worker_timeout
        self._registry = registry
        self._state = state
        self._ready = ready
        self._on_orphaned = on_orphaned
        self.parent = os.getppid()
        os.set_blocking(fd, False)

    @classmethod
    def from_env(cls, *, worker_id: str, queues: Sequence[str], worker_timeout: float,
                 registry: ActiveJobRegistry, state: WorkerState, ready: Callable[[], bool],
                 on_orphaned: Callable[[], None]) -> LivenessReporter | None:
        raw = os.environ.get(ENV_FD)
        if not raw:
            return None
        try:
            return cls(int(raw), worker_id=worker_id, queues=queues, worker_timeout=worker_timeout,
                       registry=registry, state=state, ready=ready, on_orphaned=on_orphaned)
        except (ValueError, OSError):
            return None

    def state(self) -> str:
        if self._state.draining:
            return "draining"
        return "ready" if self._ready() else "starting"

    def stop(self) -> None:
        """Nothing to stop: the reports say `draining` until the exit."""

    def report(self) -> None:
        line = json.dumps({
            "pid": os.getpid(), "worker_id": self._worker_id, "state": self.state(),
            "in_flight": len(self._registry), "queues": self._queues,
        }) + "\n"
        try:
            os.write(self.fd, line.encode())
        except BlockingIOError:
            pass  # the supervisor is behind; the next report carries the same news
        except OSError:
            pass  # the supervisor is gone; the parent-death check stops us

    async def run(self) -> None:
        interval = min(REPORT_INTERVAL, self._worker_timeout / 4)
        while True:
            self.report()
            if os.getppid() != self.parent:  # our supervisor died and we were re-parented
                self._on_orphaned()
            await asyncio.sleep(interval)
