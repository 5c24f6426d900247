"""Per-worker leases (schema 2): a heartbeat renews one workers row, however many jobs its worker holds,
and learns from lease_losses which rows were taken away from it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobsClient, sql
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend.workers import ClaimedJob, HeldRow, WorkerStore
from taskq.models import JobStatus

pytestmark = pytest.mark.timeout(60)

QUIET = {"heartbeat_interval": 30.0, "lock_timeout": 60.0, "sweep_interval": 30.0}
"""Windows under which nothing renews or sweeps by itself: the test drives each tick."""


def sleeper_registry() -> tuple[ActorRegistry, dict[int, asyncio.Event], dict[int, asyncio.Event]]:
    reg = ActorRegistry()
    started: dict[int, asyncio.Event] = {}
    stopped: dict[int, asyncio.Event] = {}

    @actor(name="lease.sleeper", registry=reg)
    async def sleeper(payload: int, ctx: JobContext[int]) -> int:
        started.setdefault(payload, asyncio.Event()).set()
        try:
            await asyncio.sleep(payload % 1000 / 10 if payload >= 1000 else 60)
        except asyncio.CancelledError:
            stopped.setdefault(payload, asyncio.Event()).set()
            raise
        return payload

    return reg, started, stopped


async def started_all(started: dict[int, asyncio.Event], payloads: list[int]) -> bool:
    return all(p in started and started[p].is_set() for p in payloads)


def losses(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM taskq.lease_losses")[0][0])


async def test_a_job_outlives_its_own_lock_while_its_worker_heartbeats(dsn: str, client: JobsClient) -> None:
    """lock_timeout 1 s, a 2.5 s job, and a second worker sweeping every 0.2 s: the job's own lock from the
    claim runs out, its worker's lease does not, so nobody reclaims it and it succeeds on attempt 1.
    The worker's own writes (claim, success) leave no lease loss behind."""
    reg, _, _ = sleeper_registry()
    async with running_worker(dsn, reg) as worker, running_worker(dsn, ActorRegistry(), queues=["elsewhere"]):
        handle = await client.enqueue("lease.sleeper", 1025)
        row = await handle.wait(timeout=15)
        assert worker.parts.heartbeat.ticks > 10
    assert row.status is JobStatus.SUCCEEDED and row.attempt == 1 and row.result == 1025
    assert [e.to_status for e in await client.events(handle.job_id)] == ["running", "succeeded"]
    assert losses(dsn) == 0


async def test_a_late_worker_learns_which_rows_a_sweeper_took(dsn: str, client: JobsClient) -> None:
    """A worker whose lease and locks ran out (as if frozen) has two of its three rows reclaimed by another
    worker's sweeper (the third is locked by a transaction, so that sweep skips it). Its next tick stops
    exactly those two actors without writing, and keeps the third."""
    reg, started, stopped = sleeper_registry()
    async with running_worker(dsn, reg, **QUIET) as late, \
            running_worker(dsn, ActorRegistry(), queues=["elsewhere"], **QUIET) as other:
        handles = [await client.enqueue("lease.sleeper", p) for p in (1, 2, 3)]
        await wait_for(lambda: started_all(started, [1, 2, 3]))
        query(dsn, "UPDATE taskq.workers SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
              late.worker_id)
        query(dsn, "UPDATE taskq.jobs SET lock_expires_at = now() - interval '1 s' WHERE worker_id = %s",
              late.worker_id)
        kept = handles[2].job_id
        with psycopg.connect(dsn) as locker:
            locker.execute("SELECT 1 FROM taskq.jobs WHERE id = %s FOR UPDATE", (kept,))
            swept = await other.parts.sweeper.sweep_once()
        assert swept == {"scheduled": 2}
        assert losses(dsn) == 2
        for h in handles[:2]:  # (the retry is due in a second: look before this worker claims it again)
            row = await h.refresh()
            assert row.status is JobStatus.SCHEDULED and row.attempt == 1 and row.worker_id is None
        await late.parts.heartbeat.tick()
        await wait_for(lambda: all(p in stopped for p in (1, 2)))
        assert 3 not in stopped and len(late.registry) == 1 and kept in late.registry
        assert losses(dsn) == 0
    for h in handles[:2]:
        assert [e.to_status for e in await client.events(h.job_id)][:2] == ["running", "scheduled"]


async def test_a_worker_whose_row_was_removed_checks_every_held_job(dsn: str, client: JobsClient) -> None:
    """With its workers row gone (and any lease losses with it), a tick registers again and compares every
    held row: the one moved to another attempt is stopped, the other runs on and succeeds."""
    reg, started, stopped = sleeper_registry()
    async with running_worker(dsn, reg, **QUIET) as worker:
        stolen = await client.enqueue("lease.sleeper", 1)
        kept = await client.enqueue("lease.sleeper", 1010)
        await wait_for(lambda: started_all(started, [1, 1010]))
        query(dsn, "UPDATE taskq.jobs SET claim_epoch = claim_epoch + 1, worker_id = 'someone-else' "
                   "WHERE id = %s", stolen.job_id)
        query(dsn, "DELETE FROM taskq.workers WHERE id = %s", worker.worker_id)
        query(dsn, "DELETE FROM taskq.lease_losses")
        await worker.parts.heartbeat.tick()
        await wait_for(lambda: 1 in stopped)
        assert query(dsn, "SELECT count(*) FROM taskq.workers WHERE id = %s", worker.worker_id)[0][0] == 1
        row = await kept.wait(timeout=10)
    assert row.status is JobStatus.SUCCEEDED and row.attempt == 1
    assert 1010 not in stopped
    assert (await stolen.refresh()).worker_id == "someone-else"


async def test_a_new_process_reusing_a_worker_id_takes_over_the_rows_left_under_it(
    dsn: str, client: JobsClient
) -> None:
    """An explicit worker_id (or a supervisor slot) reused after a crash: the new process's fresh lease would
    shelter the dead one's rows from every sweeper, so it reclaims them itself at start, and runs them."""
    reg, _, _ = sleeper_registry()
    handle = await client.enqueue("lease.sleeper", 1001)
    query(dsn, "UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, worker_id = 'slot-1', "
               "started_at = now(), lock_expires_at = now() + interval '1 hour' WHERE id = %s", handle.job_id)
    query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) VALUES (%s, 1, 1, 'slot-1')",
          handle.job_id)
    query(dsn, "INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at) "
               "VALUES ('slot-1', 'h', 1, '{default}', 1, now() + interval '1 hour')")
    async with running_worker(dsn, reg, worker_id="slot-1"):
        row = await handle.wait(timeout=15)
    assert row.status is JobStatus.SUCCEEDED and row.attempt == 2
    first = (await client.attempts(handle.job_id))[0]
    assert (first.outcome, first.error_class) == ("crashed", "WorkerCrashed")
    assert "worker_restarted" in (first.error_message or "")
    events = await client.events(handle.job_id)
    assert [e.to_status for e in events] == ["scheduled", "running", "succeeded"]
    assert events[0].detail["cause"] == "worker_restarted"


async def test_a_sweeper_leaves_the_rows_its_own_worker_tracks_alone(dsn: str, client: JobsClient) -> None:
    """Its own worker is alive by definition: its heartbeat and self-fence decide about the rows it holds."""
    reg, started, stopped = sleeper_registry()
    async with running_worker(dsn, reg, **QUIET) as worker:
        handle = await client.enqueue("lease.sleeper", 1)
        await wait_for(lambda: started_all(started, [1]))
        query(dsn, "UPDATE taskq.workers SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
              worker.worker_id)
        query(dsn, "UPDATE taskq.jobs SET lock_expires_at = now() - interval '1 s' WHERE id = %s", handle.job_id)
        assert await worker.parts.sweeper.sweep_once() == {}
        await worker.parts.heartbeat.tick()
        assert not stopped and handle.job_id in worker.registry
        assert (await handle.refresh()).status is JobStatus.RUNNING


async def test_a_row_its_worker_lost_track_of_is_reclaimed_by_that_workers_own_sweeper(
    dsn: str, client: JobsClient
) -> None:
    """An outcome the worker could not write, or a claim whose reply never arrived, leaves a running row
    under a live worker that its registry does not hold, and the worker's lease would keep it held for as
    long as the worker lives. Once the row's claim lock runs out, the worker's own sweeper reclaims it."""
    reg, _, _ = sleeper_registry()
    async with running_worker(dsn, reg) as worker:
        handle = await client.enqueue("lease.sleeper", 1001, scheduled_at=timedelta(hours=1))
        query(dsn, "UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, worker_id = %s, "
                   "started_at = now(), scheduled_at = now(), lock_expires_at = now() + interval '0.3 s' "
                   "WHERE id = %s", worker.worker_id, handle.job_id)
        query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) VALUES (%s, 1, 1, %s)",
              handle.job_id, worker.worker_id)
        row = await handle.wait(timeout=15)
    assert row.status is JobStatus.SUCCEEDED and row.attempt == 2 and row.worker_id == worker.worker_id
    first = (await client.attempts(handle.job_id))[0]
    assert (first.outcome, first.error_class) == ("crashed", "WorkerCrashed")
    events = await client.events(handle.job_id)
    assert events[0].to_status == "scheduled" and events[0].detail["swept_by"] == worker.worker_id


async def test_the_heartbeat_statement_reads_no_held_row_without_a_cancel_request(
    dsn: str, client: JobsClient
) -> None:
    """Flat ticks, checked on the plan: with 200 jobs held and one cancel requested, the heartbeat's
    cancel poll returns one row and reads it through the cancel index, not the 200."""
    reg, _, _ = sleeper_registry()
    async with running_worker(dsn, reg, concurrency=200, **QUIET) as worker:
        handles = await client.enqueue_many("lease.sleeper", list(range(1, 201)))
        await wait_for(lambda: len(worker.registry) == 200, timeout=20)
        query(dsn, "UPDATE taskq.jobs SET cancel_requested_at = now(), cancel_phase = 1 WHERE id = %s",
              handles[0].job_id)
        with psycopg.connect(dsn, autocommit=True) as conn:
            explained = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.query("heartbeat"),
                                     {"worker_id": worker.worker_id, "lock_timeout": 60.0,
                                      "sent_at": datetime.now(UTC)}).fetchone()
        assert explained is not None
        plan = explained[0][0]["Plan"]
        scans = list(_scans(plan))
        jobs_scans = [s for s in scans if s.get("Relation Name") == "jobs"]
        assert jobs_scans and all(s.get("Index Name") == "jobs_cancel_held_idx" for s in jobs_scans), scans
        assert sum(s["Actual Rows"] for s in jobs_scans) == 1


def _scans(plan: dict[str, Any]) -> Any:
    if "Relation Name" in plan:
        yield plan
    for child in plan.get("Plans", []):
        yield from _scans(child)


FROZEN = {"heartbeat_interval": 0.2, "lock_timeout": 1.0, "sweep_interval": 30.0, "poll_interval": 0.2}
"""A lease of 1 s: a claim whose reply comes back 0.6 s after it was sent is past half of it."""


def freeze_after_claim(dsn: str, store: WorkerStore, monkeypatch: pytest.MonkeyPatch, *, steal: bool) -> list[int]:
    """The first claim that takes a job returns as from a process frozen for 0.6 s between the claim and the
    actor's start (the event loop blocked: no heartbeat either). With `steal`, meanwhile the row went to another
    claim (epoch and worker changed, as a sweeper and another worker would leave it), and the lease loss the
    trigger records is gone too, so that only the check before the start can notice. Returns the reconcile
    calls' sizes, appended as they happen."""
    claim, reconcile = store.claim, store.reconcile
    frozen: list[bool] = []
    confirms: list[int] = []

    async def claim_then_freeze(queues: Sequence[str], limit: int, lock_timeout: float) -> list[ClaimedJob]:
        jobs = await claim(queues, limit, lock_timeout)
        if jobs and not frozen:
            frozen.append(True)
            if steal:
                query(dsn, "UPDATE taskq.jobs SET claim_epoch = claim_epoch + 1, worker_id = 'someone-else' "
                      "WHERE id = %s", jobs[0].id)
                query(dsn, "DELETE FROM taskq.lease_losses")
            time.sleep(0.6)  # noqa: ASYNC251 (the freeze itself: nothing else of this process runs meanwhile)
        return jobs

    async def counted(conn: Any, held: Sequence[tuple[Any, int]], lock_timeout: float) -> dict[Any, HeldRow]:
        confirms.append(len(held))
        return await reconcile(conn, held, lock_timeout)

    monkeypatch.setattr(store, "claim", claim_then_freeze)
    monkeypatch.setattr(store, "reconcile", counted)
    return confirms


async def test_an_actor_claimed_past_half_its_lease_does_not_start_on_a_row_taken_meanwhile(
    dsn: str, client: JobsClient, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker frozen between its claim and the actor's start (SIGSTOP, a VM pause, a blocked loop) past its
    lease may find the row reclaimed and even ended elsewhere: its writes would be fenced, but the actor's
    effects would happen for a job that already ended (the chaos run's history check I2 caught one). Past half
    the lease the worker asks the database first; the row is another claim's, so the actor never starts and
    nothing is written."""
    reg, started, _ = sleeper_registry()
    async with running_worker(dsn, reg, **FROZEN) as worker:
        confirms = freeze_after_claim(dsn, worker.parts.store, monkeypatch, steal=True)
        with caplog.at_level(logging.WARNING, logger="taskq.worker"):
            handle = await client.enqueue("lease.sleeper", 1001)
            await wait_for(lambda: "no longer held by this worker" in caplog.text)
        await wait_for(lambda: len(worker.registry) == 0)
        assert confirms == [1] and 1001 not in started
        row = await handle.refresh()
    assert row.status is JobStatus.RUNNING and row.worker_id == "someone-else" and row.claim_epoch == 2
    assert [e.to_status for e in await client.events(handle.job_id)] == ["running"]


async def test_an_actor_claimed_past_half_its_lease_starts_once_the_row_is_confirmed_ours(
    dsn: str, client: JobsClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same freeze with the row still ours: the database confirms it (renewing its lock) and the actor runs
    on the same claim."""
    reg, started, _ = sleeper_registry()
    async with running_worker(dsn, reg, **FROZEN) as worker:
        confirms = freeze_after_claim(dsn, worker.parts.store, monkeypatch, steal=False)
        row = await (await client.enqueue("lease.sleeper", 1001)).wait(timeout=15)
        assert confirms == [1] and 1001 in started
    assert (row.status, row.attempt, row.claim_epoch) == (JobStatus.SUCCEEDED, 1, 1)
