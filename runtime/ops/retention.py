"""Retention by terminal class: the one prune service the worker's pruner and `taskq prune` both call.

Five classes, each on its own keep window (seconds after the row finished; 0 keeps the class forever):
succeeded + cancelled jobs (`retention_succeeded`), failed + crashed + abandoned jobs (`retention_failed`),
each deleted with its events, finished job_attempts rows (`retention_attempts`, which outlive their
jobs for post-mortems), and the web API's idempotency receipts (`retention_receipts`, after their creation)
and operator audit rows (`retention_audit`, after they were written). A non-terminal job is never
deleted: its status is in every batch's predicate.

Each class is drained in bounded, index-backed batches (one committed statement each) over one
dedicated connection, never a pooled one, with a pause after each batch proportional to the time the
batch took (PAUSE_RATIO). Across the fleet one pruner works at a time: the batch statement tries an
advisory-lock gate and the pause holds it, so pruners on many workers do not add up, and the claims and
finishes of busy workers keep their connections and most of the server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from taskq.backend import retention as retention_store
from taskq.models import PruneClass, PruneResult

if TYPE_CHECKING:
    from taskq.backend import Backend
    from taskq.settings import WorkerSettings

PRUNE_BATCH = 1000
"""Rows per batch: a few milliseconds of deletes, so a batch never holds locks or a CPU for long."""
PAUSE_RATIO = 6.0
"""Pause after each batch, as a multiple of the time the batch took: a prune is busy about a seventh of
the time, which keeps a busy fleet's drain within ~15 % of its pace (benchmarks/prune.py)."""
MIN_PAUSE = 0.002

ProgressCallback = Callable[[int, float], None]
"""Called after each batch with (rows deleted so far, seconds since the prune started)."""


def keep_windows(settings: WorkerSettings) -> dict[PruneClass, float]:
    return {
        PruneClass.SUCCEEDED: settings.retention_succeeded,
        PruneClass.FAILED: settings.retention_failed,
        PruneClass.ATTEMPTS: settings.retention_attempts,
        PruneClass.RECEIPTS: settings.retention_receipts,
        PruneClass.AUDIT: settings.retention_audit,
    }


async def prune(
    backend: Backend,
    keep: dict[PruneClass, float],
    *,
    dry_run: bool = False,
    batch_size: int = PRUNE_BATCH,
    pause_ratio: float = PAUSE_RATIO,
    on_progress: ProgressCallback | None = None,
    stop: asyncio.Event | None = None,
) -> PruneResult:
    """Delete every row past its class's keep window (`keep`: seconds per class, 0 or absent = keep forever), or
    with `dry_run` count them and delete nothing. Safe to run on many workers at once (disjoint batches).
    `stop`, when set, ends the prune after the current batch (a stopping worker)."""
    started = time.monotonic()
    async with retention_store.dedicated_connection(backend) as conn:
        if dry_run:
            counted = await retention_store.job_prune_count(conn, keep)
            return counted.model_copy(update={"seconds": time.monotonic() - started})
        done = dict.fromkeys(PruneClass, 0)
        events = batches = 0
        for cls in PruneClass:
            window = keep.get(cls, 0.0)
            if window <= 0:
                continue
            while stop is None or not stop.is_set():
                t0 = time.monotonic()
                rows, ev = await retention_store.job_prune_batch(conn, cls, window, batch_size)
                took = time.monotonic() - t0
                batches += 1
                done[cls] += rows
                events += ev
                if on_progress is not None:
                    on_progress(sum(done.values()), time.monotonic() - started)
                if rows < batch_size:
                    break
                await retention_store.job_prune_pause(conn, max(MIN_PAUSE, took * pause_ratio))
    return PruneResult(
        succeeded=done[PruneClass.SUCCEEDED], failed=done[PruneClass.FAILED], attempts=done[PruneClass.ATTEMPTS],
        receipts=done[PruneClass.RECEIPTS], audit=done[PruneClass.AUDIT],
        events=events, batches=batches, seconds=time.monotonic() - started,
    )
