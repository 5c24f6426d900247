"""The worker runtime: `worker_main_async(settings, actors)` and `worker_main(...)` (uvloop)."""

from __future__ import annotations

from taskq.worker.main import Worker, worker_main, worker_main_async
from taskq.worker.registry import ActiveJob, ActiveJobRegistry

__all__ = ["ActiveJob", "ActiveJobRegistry", "Worker", "worker_main", "worker_main_async"]
