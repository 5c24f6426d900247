"""Job dependencies through the terminal paths that need real worker processes and real signals: a parent
whose worker is killed with kill -9 (reclaimed by another worker's sweeper, or by the supervisor's
reclaimer at once), and shutdown's cancelled verdict. The child settles in the parent's transaction. And a
worker killed with kill -9 while its resolver settles a fan-out beyond one chunk."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any
from uuid import UUID

import psycopg
import pytest
from testkit import insert_job, query, wait_until

from taskq import JobsClient
from taskq.invariants import check_invariants
from taskq.supervisor.reclaim import Reclaimer
from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def child_of(dsn: str, parent: UUID) -> UUID:
    """A job of an actor no worker knows, waiting on `parent` (so it can only settle, never run)."""

    async def go() -> UUID:
        async with await JobsClient.connect(dsn) as client:
            handle = await client.enqueue("dep.child", 1, depends_on=[parent], queue="nobody")
            return handle.job_id

    return asyncio.run(go())


def row(dsn: str, job_id: UUID) -> dict[str, Any]:
    cols = ["status", "worker_id", "error_class", "cancel_reason"]
    (values,) = query(dsn, f"SELECT {', '.join(cols)} FROM taskq.jobs WHERE id = %s", job_id)
    return dict(zip(cols, values, strict=True))


def terminal_event(dsn: str, job_id: UUID) -> tuple[str, dict[str, Any], str]:
    (found,) = query(dsn, "SELECT to_status, detail, xmin::text FROM taskq.job_events WHERE job_id = %s "
                          "ORDER BY id DESC LIMIT 1", job_id)
    return found[0], found[1], found[2]


def assert_cascaded(dsn: str, parent: UUID, child: UUID, status: str) -> dict[str, Any]:
    parent_status, parent_detail, parent_xid = terminal_event(dsn, parent)
    child_status, child_detail, child_xid = terminal_event(dsn, child)
    assert parent_status == status
    assert (child_status, child_detail["cause"]) == ("cancelled", f"parent-failure:{status}")
    assert row(dsn, child)["error_class"] == "ParentFailed"
    assert parent_xid == child_xid  # one transaction
    return parent_detail


def test_a_parent_killed_with_kill_9_at_its_last_attempt_ends_crashed_and_its_child_cascades(
    dsn: str, spawn_worker: Any
) -> None:
    w1 = spawn_worker()
    w1_id = w1.worker_id()
    parent = insert_job(dsn, "test.sleep_once", {"seconds": 30}, max_attempts=1)
    child = child_of(dsn, parent)
    wait_until(lambda: row(dsn, parent)["worker_id"] == w1_id)
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    spawn_worker().worker_id()  # its sweeper reclaims the dead worker's row
    wait_until(lambda: row(dsn, parent)["status"] == "crashed", timeout=30)
    detail = assert_cascaded(dsn, parent, child, "crashed")
    assert detail["swept_by"]  # a sweeper, not the worker, wrote it


def test_the_supervisors_reclaim_of_a_killed_worker_cascades_to_the_child(dsn: str, spawn_worker: Any) -> None:
    # a long lease: no sweeper would reclaim the row within the test; the supervisor's reclaimer does at once
    w1 = spawn_worker(lock_timeout=120.0)
    w1_id = w1.worker_id()
    parent = insert_job(dsn, "test.sleep_once", {"seconds": 30}, max_attempts=1)
    child = child_of(dsn, parent)
    wait_until(lambda: row(dsn, parent)["worker_id"] == w1_id and row(dsn, parent)["status"] == "running")
    w1.signal(signal.SIGKILL)
    w1.wait(10)
    reclaimer = Reclaimer(dsn, "supervisor:test", give_up_after=30.0)
    reclaimer.reclaim(w1_id, "worker_died", "killed by signal 9", time.monotonic())
    assert reclaimer.pending == []
    detail = assert_cascaded(dsn, parent, child, "crashed")
    assert detail["cause"] == "worker_died"


def test_shutdowns_cancelled_verdict_cascades_to_the_child(dsn: str, spawn_worker: Any) -> None:
    # as tests/system/test_shutdown.py: an operator's cancel still pending when the deploy arrives
    w1 = spawn_worker(cancellation_grace_period=30.0, cleanup_grace_period=0.5, shutdown_timeout=60.0)
    w1_id = w1.worker_id()
    parent = insert_job(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    child = child_of(dsn, parent)
    wait_until(lambda: row(dsn, parent)["worker_id"] == w1_id and row(dsn, parent)["status"] == "running")
    query(dsn, "UPDATE taskq.jobs SET cancel_phase = 1, cancel_requested_at = now() WHERE id = %s", parent)
    query(dsn, "SELECT pg_notify('taskq_cancel', %s)", f"{parent}:1:1:{w1_id}")
    wait_until(lambda: "cancel phase 0 -> 1" in w1.log())
    w1.signal(signal.SIGINT)
    wait_until(lambda: "shutting down" in w1.log())
    w1.signal(signal.SIGINT)
    assert w1.wait(20) == exitcodes.OK
    assert row(dsn, parent)["error_class"] == "CancelledForced"
    detail = assert_cascaded(dsn, parent, child, "cancelled")
    # shutdown's RELEASING verdict (cause 'shutdown') and the forced consumer's own cancelled write race for
    # the row (job_release_batch says so); on a loaded machine either may win, and both are terminal writes
    # that must settle the child
    assert detail.get("cause") == "shutdown" or detail.get("cancel_phase") == 2, detail


def test_a_worker_killed_with_kill_9_mid_resolution_strands_nothing(dsn: str, spawn_worker: Any) -> None:
    """A fan-out beyond one chunk: the resolver of worker 1 is stopped midway (a child row it needs is held
    by this test), worker 1 is killed with kill -9, and its step's transaction ends without committing.
    What it had committed stays, its backlog row stays, and a new worker finishes the rest, each child
    settled exactly once."""
    chunk, children = 50, 300
    dbname = query(dsn, "SELECT current_database()")[0][0]
    query(dsn, f'ALTER DATABASE "{dbname}" SET taskq.settle_chunk = \'{chunk}\'')

    async def enqueue() -> tuple[UUID, list[UUID]]:
        async with await JobsClient.connect(dsn) as client:
            parent = await client.enqueue("test.noop", 1)
            kids = await client.enqueue_many("dep.child", list(range(children)), depends_on=[parent],
                                             queue="nobody")
            return parent.job_id, [k.job_id for k in kids]

    parent, kids = asyncio.run(enqueue())
    released = "SELECT count(*) FROM taskq.jobs WHERE queue = 'nobody' AND status = 'pending'"
    stuck = ("SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s "
             "AND datname = current_database()")
    step = "%settle_backlog%"
    with psycopg.connect(dsn) as holder:
        # the child settled last (the edges go in child id order): the resolver's last step waits for it
        holder.execute("SELECT 1 FROM taskq.jobs WHERE id = %s FOR UPDATE", (max(kids),))
        w1 = spawn_worker()
        blocked = wait_until(lambda: query(dsn, stuck, step), timeout=60)
        assert row(dsn, parent)["status"] == "succeeded"
        before = query(dsn, released)[0][0]
        assert before == children - chunk, before  # the parent's chunk, and the resolver's committed steps
        w1.signal(signal.SIGKILL)
        w1.wait(10)
        # the server learns of a dead client at its next write to the socket; end that session as it would
        query(dsn, "SELECT pg_terminate_backend(%s)", blocked[0][0])
        wait_until(lambda: not query(dsn, stuck, step))
        holder.rollback()
    assert query(dsn, released)[0][0] == before  # the killed step committed nothing
    assert query(dsn, "SELECT parent_id, count(*) FROM taskq.dependency_backlog GROUP BY 1") == [(parent, 1)]
    spawn_worker(queues=["elsewhere"]).worker_id()  # its resolver takes the backlog up at its start
    wait_until(lambda: query(dsn, released)[0][0] == children, timeout=60)
    wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.dependency_backlog")[0][0] == 0)
    assert query(dsn, """SELECT count(*), count(DISTINCT e.job_id) FROM taskq.job_events AS e
                         JOIN taskq.jobs AS j ON j.id = e.job_id
                         WHERE j.queue = 'nobody' AND e.from_status = 'awaiting_parents'""") == [(children, children)]
    assert query(dsn, "SELECT sum(parents_remaining) FROM taskq.jobs WHERE queue = 'nobody'") == [(0,)]

    async def check() -> list[Any]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            return list((await check_invariants(conn, stale_after=0)).violations)

    assert asyncio.run(check()) == []
