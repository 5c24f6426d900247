"""Lifecycle hooks (on_success, on_retry_exhausted, on_cancel): run after the terminal write, with the
terminal row; best-effort and timeout-bounded."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.models import JobRow
    from taskq.worker.registry import ActiveJob

log = logging.getLogger("taskq.worker")


class Hooks:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def run(self, hook: Any, entry: ActiveJob, timeout: float, name: str) -> None:
        try:
            row = await self._backend.get(entry.id)
            if row is None:
                return
            await asyncio.wait_for(self._call(hook, row), timeout)
        except TimeoutError:
            log.warning("job %s: %s hook still running after %.1fs; abandoned", entry.id, name, timeout)
        except Exception:
            log.exception("job %s: %s hook raised (ignored)", entry.id, name)

    @staticmethod
    async def _call(hook: Any, row: JobRow) -> None:
        if asyncio.iscoroutinefunction(hook):
            await hook(row)
        else:
            result = await asyncio.to_thread(hook, row)
            if asyncio.iscoroutine(result):
                await result
