"""Why a ready job waits, by isolation class: `job_class_slots` reads each live worker's capacity and busy
slots of the job's class, and `describe_class_wait` says so when every worker of the queue is full."""

from __future__ import annotations

from pathlib import Path

from apps import taskq_capacity_app as app
from prometheus_client import REGISTRY
from testkit import running_worker, wait_for

from taskq.backend import Backend
from taskq.backend.workers import job_class_slots
from taskq.client import JobsClient
from taskq.models import ClassSlots, describe_class_wait


async def test_a_process_job_behind_a_busy_child_is_said_to_wait_for_a_process_slot_and_an_async_one_is_not(
    dsn: str, client: JobsClient, tmp_path: Path
) -> None:
    async with running_worker(dsn, app.actors, max_children=1) as worker:
        busy = await client.enqueue(app.crunch, app.Crunch(seconds=30, started=str(tmp_path)))
        await wait_for(lambda: (tmp_path / str(busy.job_id)).exists())
        # the metrics: each class's capacity, and its busy slots as of the last claim
        assert sample("taskq_worker_capacity", "process") == 1 and sample("taskq_worker_capacity", "async") == 200
        await wait_for(lambda: sample("taskq_jobs_busy", "process") == 1)
        waiting = await client.enqueue(app.crunch, app.Crunch(seconds=1, started=str(tmp_path)))
        backend = await Backend.open(dsn)
        try:
            slots = await job_class_slots(backend, waiting.job_id)
            assert slots == [ClassSlots(worker_id=worker.worker_id, isolation="process", capacity=1, busy=1)]
            assert describe_class_wait("default", slots) == (
                "waiting for a free process slot: every worker of queue default is full (process 1/1 on 1 worker)")
            nap = await client.enqueue(app.nap, app.Nap(seconds=0))
            stray = await client.enqueue("nobody.knows", {})
            for job_id in (nap.job_id, stray.job_id):
                (async_slots,) = await job_class_slots(backend, job_id)
                assert async_slots.isolation == "async" and async_slots.capacity == 200
                assert describe_class_wait("default", [async_slots]) is None
        finally:
            await backend.close()
        await client.cancel(busy.job_id, reason="the test is done")


def sample(name: str, isolation: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"isolation": isolation})


def test_no_registered_worker_or_one_free_slot_is_no_class_wait() -> None:
    full = ClassSlots(worker_id="a", isolation="thread", capacity=2, busy=2)
    assert describe_class_wait("q", []) is None
    assert describe_class_wait("q", [full, ClassSlots(worker_id="b", isolation="thread", capacity=2, busy=1)]) is None
    assert describe_class_wait("q", [full, full]) == (
        "waiting for a free thread slot: every worker of queue q is full (thread 4/4 on 2 workers)")
