"""Why a ready job waits, by isolation class, with a real worker: the per-class gauges, and `taskq job`'s
reason (taskq.ops.queues.job_wait_reason) when every slot of the job's class is taken."""

from __future__ import annotations

from pathlib import Path

from apps import taskq_capacity_app as app
from prometheus_client import REGISTRY
from testkit import running_worker, wait_for

from taskq.backend import Backend
from taskq.client import JobsClient
from taskq.ops.queues import job_wait_reason


async def test_a_process_job_behind_a_busy_child_is_said_to_wait_for_a_process_slot_and_an_async_one_is_not(
    dsn: str, client: JobsClient, tmp_path: Path
) -> None:
    async with running_worker(dsn, app.actors, max_children=1):
        busy = await client.enqueue(app.crunch, app.Crunch(seconds=30, started=str(tmp_path)))
        await wait_for(lambda: (tmp_path / str(busy.job_id)).exists())
        # the metrics: each class's capacity, and its busy slots as of the last claim
        assert sample("taskq_worker_capacity", "process") == 1 and sample("taskq_worker_capacity", "async") == 200
        await wait_for(lambda: sample("taskq_jobs_busy", "process") == 1)
        waiting = await client.enqueue(app.crunch, app.Crunch(seconds=1, started=str(tmp_path)))
        backend = await Backend.open(dsn)
        try:
            reason = await job_wait_reason(backend, waiting.job_id)
            assert reason is not None
            assert "its class (process) has no free slot on any worker (1/1 in use on 1 worker)" in reason
            # an async job beside it is not held by the full process class: it runs and is done
            nap = await client.enqueue(app.nap, app.Nap(seconds=0))
            assert (await nap.wait(timeout=10)).status == "succeeded"
            assert await job_wait_reason(backend, nap.job_id) is None
        finally:
            await backend.close()
        await client.cancel(busy.job_id, reason="the test is done")


def sample(name: str, isolation: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"isolation": isolation})
