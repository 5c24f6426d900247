"""Every stop path releases every job it holds (issue 33, cancellation spec §11): a worker holding 5,000
jobs, stopped by its shutdown event (what SIGTERM sets) or by cancelling the task that runs
worker_main_async (how an embedding application stops it), gives every one of them back to the fleet,
in batched writes, and none is left to the sweeper."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from testkit import FAST_WINDOWS, query, wait_for

from taskq import JobContext, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.settings import WorkerSettings
from taskq.worker.main import Worker, worker_main_async

pytestmark = pytest.mark.timeout(240)

JOBS = 5_000


def registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="stop.hold", registry=reg)
    async def hold(payload: int, ctx: JobContext[int]) -> int:
        await asyncio.Event().wait()  # until the stop cancels it
        return payload

    return reg


@pytest.mark.parametrize("how", ["shutdown_event", "task_cancel"])
async def test_a_stop_releases_every_held_job(dsn: str, client: JobsClient, how: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="taskq")
    await client.enqueue_many("stop.hold", list(range(JOBS)))
    settings = WorkerSettings(dsn=dsn, **(FAST_WINDOWS | {"concurrency": JOBS, "claim_batch_size": 1000,
                                                          "lock_timeout": 120.0, "shutdown_timeout": 60.0}))
    worker = Worker(settings, registry())
    task = asyncio.get_running_loop().create_task(worker_main_async(settings, registry(), worker=worker,
                                                                    handle_signals=False))

    def running() -> bool:
        if task.done():
            task.result()
        return bool(query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'running'")[0][0] == JOBS)

    await wait_for(running, timeout=90, interval=0.2)
    await wait_for(lambda: len(worker.registry) == JOBS, timeout=30)
    if how == "shutdown_event":
        worker.request_shutdown()
        code: Any = await asyncio.wait_for(task, 90)
    else:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 90)
        code = None
    counts = dict(query(dsn, "SELECT status, count(*) FROM taskq.jobs GROUP BY status"))
    assert counts == {"pending": JOBS}, f"after the stop ({how}): {counts}"
    assert "could not release" not in caplog.text
    # the rows went back in a few batched writes, not one statement per job
    # (each row's xmin is the transaction that last wrote it: its release)
    released = query(dsn, "SELECT count(DISTINCT xmin::text) FROM taskq.jobs")
    assert released[0][0] <= JOBS // 50, f"{released[0][0]} release transactions for {JOBS} jobs"
    if code is not None:
        assert code == 0


async def test_a_release_slower_than_one_step_but_answered_is_waited_for(dsn: str, client: JobsClient,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A healthy but slow database (here: one row's release waits 3 s on another transaction's lock, longer
    than the 2 s a last step gets once the database is in doubt): the stop waits for the release it is
    writing, every row goes back, and the worker exits 0 with nothing reported as still held."""
    import psycopg

    caplog.set_level(logging.INFO, logger="taskq")
    await client.enqueue_many("stop.hold", list(range(20)))
    settings = WorkerSettings(dsn=dsn, **(FAST_WINDOWS | {"concurrency": 20, "lock_timeout": 120.0,
                                                          "shutdown_timeout": 60.0}))
    worker = Worker(settings, registry())
    task = asyncio.get_running_loop().create_task(worker_main_async(settings, registry(), worker=worker,
                                                                    handle_signals=False))
    await wait_for(lambda: len(worker.registry) == 20, timeout=60)
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("SELECT id FROM taskq.jobs ORDER BY id LIMIT 1 FOR NO KEY UPDATE")
        worker.request_shutdown()
        # the release is waiting on the lock: hold it 3 s more, then let it through
        await wait_for(lambda: query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                          " AND datname = current_database()")[0][0] > 0, timeout=30)
        await asyncio.sleep(3.0)  # the scenario itself: a write slower than the in-doubt step budget
        await locker.rollback()
    code = await asyncio.wait_for(task, 90)
    assert code == 0
    counts = dict(query(dsn, "SELECT status, count(*) FROM taskq.jobs GROUP BY status"))
    assert counts == {"pending": 20}, counts
    stopped = [r.getMessage() for r in caplog.records if "stopped: released=" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].endswith("still_held=[]"), stopped
