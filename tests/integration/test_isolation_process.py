"""Process isolation against a real PostgreSQL: real child processes, real signals."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
import pytest
from apps import taskq_isolation_app as app
from testkit import running_worker, wait_for

from taskq import JobFailed, JobsClient
from taskq.actors.declaration import ActorRegistry
from taskq.actors.process import ProcessExecutor
from taskq.models import JobRow, JobStatus
from taskq.worker.main import Worker

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

ACTORS = ActorRegistry(app.actors)


def gone(pid: int) -> bool:
    """No process with this pid exists any more (a zombie still does: nobody reaped it)."""
    return not psutil.pid_exists(pid)


def our_zombies() -> list[int]:
    return [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]


def process_executor(worker: Worker) -> ProcessExecutor:
    executor = worker.executor_for(ACTORS["iso.proc.whoami"])
    assert isinstance(executor, ProcessExecutor)
    return executor


async def started_pid(client: JobsClient, job_id: UUID) -> int:
    """The child's pid, once the actor has reported that it runs (a checkpoint written by the worker)."""

    async def progress() -> Any:
        row = await client.backend.get(job_id)
        return row is not None and row.progress and row.progress.get("message") == "started" and row.progress

    return int((await wait_for(progress, timeout=20))["data"]["pid"])


async def test_process_actor_result_is_stored_and_ran_in_its_own_process_group(
    dsn: str, client: JobsClient
) -> None:
    async with running_worker(dsn, ACTORS):
        handle = await client.enqueue("iso.proc.whoami", 5)
        row = await handle.wait(timeout=30)
    result = row.result
    assert row.status is JobStatus.SUCCEEDED and result["echo"] == 5
    assert result["pid"] != os.getpid() and result["ppid"] == os.getpid()
    assert result["pgid"] == result["pid"]  # its own group: a signal to it cannot reach the worker


async def test_a_warm_child_is_reused_and_max_tasks_per_child_recycles_it(
    dsn: str, client: JobsClient
) -> None:
    pids: dict[int, list[int]] = {}
    for limit in (0, 1):
        async with running_worker(dsn, ACTORS, max_tasks_per_child=limit, max_children=1):
            pids[limit] = []
            for n in range(2):
                row = await (await client.enqueue("iso.proc.whoami", n)).wait(timeout=30)
                pids[limit].append(row.result["pid"])
    assert pids[0][0] == pids[0][1], "without a limit the same warm child runs both jobs"
    assert pids[1][0] != pids[1][1], "max_tasks_per_child=1 starts a new child for the second job"


async def test_max_memory_per_child_recycles_a_child_that_grew(dsn: str, client: JobsClient) -> None:
    # any Python child is above 1 MiB of RSS, so every job is followed by a recycle
    async with running_worker(dsn, ACTORS, max_memory_per_child=1 << 20, max_children=1):
        first = await (await client.enqueue("iso.proc.whoami", 1)).wait(timeout=30)
        second = await (await client.enqueue("iso.proc.whoami", 2)).wait(timeout=30)
    assert first.result["pid"] != second.result["pid"]


async def test_cooperative_cancel_reaches_the_child(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, ACTORS, cancellation_grace_period=10.0, cleanup_grace_period=10.0):
        handle = await client.enqueue("iso.proc.cooperative", {"seconds": 60})
        await started_pid(client, handle.job_id)
        await client.cancel(handle.job_id, reason="stop")
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=10)
    row = failed.value.row
    assert row.status is JobStatus.CANCELLED and row.error_class == "CancelledCooperatively"


async def test_child_ignoring_the_cancel_is_interrupted_by_sigterm_at_phase_two(
    dsn: str, client: JobsClient, tmp_path: Path
) -> None:
    cleanup = tmp_path / "cleanup"
    async with running_worker(dsn, ACTORS) as worker:
        handle = await client.enqueue("iso.proc.stubborn", {"seconds": 60, "cleanup": str(cleanup)})
        pid = await started_pid(client, handle.job_id)
        await client.cancel(handle.job_id)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=20)
        # a forced child is not trusted with another job: it is recycled
        await wait_for(lambda: gone(pid), timeout=10)
        again = await (await client.enqueue("iso.proc.whoami", 1)).wait(timeout=30)
        assert process_executor(worker).children == [again.result["pid"]]
    row = failed.value.row
    assert row.status is JobStatus.CANCELLED and row.error_class == "CancelledForced"
    assert cleanup.read_text() == "finally ran"  # ActorInterrupted unwound the actor: its finally ran


async def test_child_ignoring_sigterm_is_sigkilled_after_the_cleanup_grace_and_abandoned(
    dsn: str, client: JobsClient
) -> None:
    async with running_worker(dsn, ACTORS) as worker:
        handle = await client.enqueue("iso.proc.deaf", {"seconds": 60})
        pid = await started_pid(client, handle.job_id)
        await client.cancel(handle.job_id)
        with pytest.raises(JobFailed) as failed:
            await handle.wait(timeout=20)
        await wait_for(lambda: gone(pid), timeout=10)
        assert pid not in process_executor(worker).children
        assert pid not in [c.pid for c in psutil.Process().children()]
        # the pool serves the next process job with a new child
        again = await (await client.enqueue("iso.proc.whoami", 1)).wait(timeout=30)
        assert again.status is JobStatus.SUCCEEDED and again.result["pid"] != pid
    row = failed.value.row
    assert row.status is JobStatus.ABANDONED and row.error_class == "CancelAbandoned"


@pytest.mark.parametrize(("how", "expected"), [("exit", "exit code 3"), ("segv", "signal 11 (SIGSEGV)")])
async def test_child_that_dies_fails_the_attempt_with_child_process_died_and_is_retried(
    dsn: str, client: JobsClient, how: str, expected: str
) -> None:
    async with running_worker(dsn, ACTORS):
        handle = await client.enqueue("iso.proc.die_once", {"how": how})
        row = await handle.wait(timeout=30)
    assert row.status is JobStatus.SUCCEEDED and row.result == {"attempt": 2}
    first, second = await client.attempts(handle.job_id)
    assert (first.outcome, first.error_class) == ("retried", "ChildProcessDied")
    assert expected in (first.error_message or ""), first.error_message
    assert (second.outcome, second.error_class) == ("succeeded", None)


async def test_actor_exceptions_come_back_from_the_child_with_their_class_and_retry_policy(
    dsn: str, client: JobsClient
) -> None:
    async with running_worker(dsn, ACTORS):
        retried = await client.enqueue("iso.proc.fails", "again")
        hopeless = await client.enqueue("iso.proc.fails", "hopeless")
        with pytest.raises(JobFailed) as first:
            await retried.wait(timeout=30)
        with pytest.raises(JobFailed) as second:
            await hopeless.wait(timeout=30)
    assert first.value.row.error_class == "Boom" and first.value.row.error_message == "bad luck on attempt 2"
    assert [a.outcome for a in await client.attempts(retried.job_id)] == ["retried", "failed"]
    assert second.value.row.error_class == "NonRetryableError" and second.value.row.attempt == 1


async def test_progress_and_child_jobs_from_a_child_are_persisted_by_the_worker(
    dsn: str, client: JobsClient
) -> None:
    async with running_worker(dsn, ACTORS):
        handle = await client.enqueue("iso.proc.checkpoints", 2)
        row = await handle.wait(timeout=30)
        kid = await client.get(row.result["kid"])
        assert kid is not None
        kid_row: JobRow = await kid.wait(timeout=30)
    assert row.progress == {"data": {"step": 2}, "message": "two"}
    assert row.result["before"] is None and row.result["last"] == {"step": 2}
    assert kid_row.parent_id == handle.job_id and kid_row.result["echo"] == 7


async def test_no_child_is_left_running_or_unreaped_after_the_worker_stops(
    dsn: str, client: JobsClient
) -> None:
    async with running_worker(dsn, ACTORS, max_children=3) as worker:
        busy = await client.enqueue("iso.proc.deaf", {"seconds": 60})
        busy_pid = await started_pid(client, busy.job_id)
        rows = [await (await client.enqueue("iso.proc.whoami", n)).wait(timeout=30) for n in range(2)]
        pids = set(process_executor(worker).children) | {busy_pid} | {r.result["pid"] for r in rows}
        assert len(pids) >= 2 and all(not gone(p) for p in pids)
    # the stop ran shutdown (release), then reap(): channels closed, SIGKILL for the deaf one, waitpid
    assert [p for p in pids if not gone(p)] == []
    assert our_zombies() == []
    assert (await busy.refresh()).status is JobStatus.PENDING  # released to the fleet, not cancelled


async def test_a_child_killed_from_outside_fails_the_attempt_with_child_process_died(
    dsn: str, client: JobsClient
) -> None:
    """Only the worker's own signals count as a forced cancel: a child killed from outside (as by the OOM
    killer) is a death of the attempt."""
    async with running_worker(dsn, ACTORS):
        handle = await client.enqueue("iso.proc.deaf", {"seconds": 60})
        pid = await started_pid(client, handle.job_id)
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: gone(pid), timeout=10)
        row = await wait_for(lambda: _first_attempt_done(client, handle.job_id), timeout=20)
    assert row.error_class == "ChildProcessDied" and "SIGKILL" in (row.error_message or "")


async def _first_attempt_done(client: JobsClient, job_id: UUID) -> Any:
    attempts = await client.attempts(job_id)
    return attempts[0] if attempts and attempts[0].outcome is not None else None


async def test_shutdown_interrupts_a_process_actor_and_releases_its_job(
    dsn: str, client: JobsClient, tmp_path: Path
) -> None:
    cleanup = tmp_path / "cleanup"
    async with running_worker(dsn, ACTORS) as worker:
        handle = await client.enqueue("iso.proc.stubborn", {"seconds": 60, "cleanup": str(cleanup)})
        await started_pid(client, handle.job_id)
    row = await handle.refresh()
    assert row.status is JobStatus.PENDING and row.interrupt_count == 1 and row.cancel_requested_at is None
    assert worker.state.summary["released"] == [str(handle.job_id)]
    assert cleanup.read_text() == "finally ran"  # SIGTERM at the shutdown's force step unwound the actor


async def test_a_process_actor_enqueues_children_with_a_unique_key(dsn: str, client: JobsClient) -> None:
    async with running_worker(dsn, ACTORS):
        row = await (await client.enqueue("iso.proc.unique_kids", "kid-key")).wait(timeout=30)
    assert row.result["created"] == [True, False] and row.result["same"] is True
    kid = await client.get(row.result["kid"])
    assert kid is not None and kid.row is not None
    assert kid.row.unique_key == "kid-key" and kid.row.parent_id == row.id


async def test_a_process_actor_reads_its_parents_results_and_enqueues_a_dependent_job(dsn: str) -> None:
    async with await JobsClient.connect(dsn, registry=ACTORS) as client, running_worker(dsn, ACTORS):
        parent = await client.enqueue("iso.proc.whoami", 1)
        child = await client.enqueue("iso.proc.dependent", 2, depends_on=[parent])
        row = await child.wait(timeout=60)
        parent_row = await parent.refresh()
    assert row.result["parents"] == {str(parent.job_id): parent_row.result}
    # enqueued while its parent (the actor's own job) was still running
    assert row.result["waiting_status"] == "awaiting_parents"
