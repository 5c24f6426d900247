"""SyncJobsClient where it differs from running the async cases (test_client.py and
test_client_bad_input.py run every case on both faces): the caller's sync transaction, a fork, many
threads, and the caller's connection refused for each documented reason, on both faces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import Connection
from psycopg.rows import dict_row
from testkit import query

from taskq import JobsClient, SyncJobsClient
from taskq.exceptions import ConnectionUnusable
from taskq.models import JobStatus

APPS = Path(__file__).resolve().parent.parent / "apps"


@pytest.fixture
def sync_jobs(dsn: str) -> Iterator[SyncJobsClient]:
    with SyncJobsClient.connect(dsn) as client:
        yield client


@pytest.fixture
def own_conn(dsn: str) -> Iterator[Connection[Any]]:
    """The application's own sync connection, not in autocommit mode: enqueue joins its transaction."""
    with psycopg.connect(dsn) as conn:
        yield conn


def _count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0])


def test_sync_enqueue_in_an_open_transaction_commits_with_it(
    sync_jobs: SyncJobsClient, own_conn: Connection[Any], dsn: str
) -> None:
    handle = sync_jobs.enqueue("x", {"n": 1}, connection=own_conn)
    sync_jobs.enqueue_many("x", list(range(5)), connection=own_conn, chunk_size=2)
    assert own_conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
    assert sync_jobs.get(handle.job_id) is None
    assert _count(dsn) == 0
    own_conn.commit()
    fetched = sync_jobs.get(handle.job_id)
    assert fetched is not None and fetched.row is not None and fetched.row.status is JobStatus.PENDING
    assert _count(dsn) == 6


def test_sync_enqueue_in_a_rolled_back_transaction_leaves_no_job(
    sync_jobs: SyncJobsClient, own_conn: Connection[Any], dsn: str
) -> None:
    own_conn.execute("SELECT 1")  # the application's own work, already in the transaction
    handle = sync_jobs.enqueue("x", 1, connection=own_conn)
    many = sync_jobs.enqueue_many("x", [1, 2], connection=own_conn)
    unique = sync_jobs.enqueue("x", 3, connection=own_conn, unique_key="k")
    own_conn.rollback()
    assert all(sync_jobs.get(h.job_id) is None for h in [handle, unique, *many])
    assert _count(dsn) == 0


def test_sync_transactional_enqueue_works_on_a_connection_with_its_own_row_factory(
    sync_jobs: SyncJobsClient, dsn: str
) -> None:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        handle = sync_jobs.enqueue("x", 1, connection=conn)
        sync_jobs.enqueue_many("x", [2, 3], connection=conn)
        sync_jobs.enqueue_many("x", [4, 5], connection=conn, unique_key=True)
        conn.commit()
    assert handle.row is not None and handle.row.status is JobStatus.PENDING
    assert _count(dsn) == 5


def test_sync_client_wait_returns_the_row_once_the_job_succeeded(sync_jobs: SyncJobsClient, dsn: str) -> None:
    handle = sync_jobs.enqueue("x", 1)
    done = threading.Event()

    def finish() -> None:
        query(dsn, "UPDATE taskq.jobs SET status = 'succeeded', result = '7', finished_at = now() WHERE id = %s",
              handle.job_id)
        done.set()

    threading.Thread(target=finish).start()
    row = handle.wait(timeout=30)
    assert done.is_set() and row.status is JobStatus.SUCCEEDED and handle.result() == 7


def test_sync_client_works_in_a_forked_child_and_its_parent_goes_on(dsn: str) -> None:
    env = os.environ | {"PYTHONPATH": str(APPS)}
    proc = subprocess.run([sys.executable, str(APPS / "taskq_sync_fork_app.py"), dsn], capture_output=True,
                          text=True, env=env, timeout=90)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["child_exit"] == 0 and seen["parent_ok"], seen
    actors = sorted(r[0] for r in query(dsn, "SELECT actor FROM taskq.jobs"))
    assert actors == ["fork.after", "fork.before", "fork.child"]


def test_sixteen_threads_enqueue_at_once_on_one_sync_client(sync_jobs: SyncJobsClient, dsn: str) -> None:
    start = threading.Barrier(16)
    ids: list[UUID] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        try:
            start.wait(timeout=30)
            mine = [sync_jobs.enqueue("threads", {"t": n, "i": i}).job_id for i in range(20)]
            mine += [h.job_id for h in sync_jobs.enqueue_many("threads", [{"t": n, "b": i} for i in range(5)])]
            with lock:
                ids.extend(mine)
        except BaseException as exc:
            with lock:
                errors.append(exc)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(set(ids)) == 16 * 25
    assert _count(dsn) == 16 * 25


# -- the caller's connection, refused (both faces) ---------------------------------------------------


@pytest.fixture
async def async_jobs(dsn: str) -> AsyncIterator[JobsClient]:
    async with await JobsClient.connect(dsn) as client:
        yield client


async def test_sync_client_refuses_an_async_connection_and_a_closed_one(
    sync_jobs: SyncJobsClient, dsn: str
) -> None:
    closed = psycopg.connect(dsn)
    closed.close()
    with pytest.raises(ConnectionUnusable, match="is closed"):
        sync_jobs.enqueue("x", 1, connection=closed)
    async with await psycopg.AsyncConnection.connect(dsn) as aconn:
        with pytest.raises(ConnectionUnusable, match="needs a Connection, got AsyncConnection"):
            sync_jobs.enqueue_many("x", [1], connection=aconn)  # type: ignore[arg-type]
    assert _count(dsn) == 0


async def test_async_client_refuses_a_sync_connection_and_a_closed_one(async_jobs: JobsClient, dsn: str) -> None:
    with psycopg.connect(dsn) as conn:
        with pytest.raises(ConnectionUnusable, match="needs a AsyncConnection, got Connection"):
            await async_jobs.enqueue("x", 1, connection=conn)  # type: ignore[arg-type]
    closed = await psycopg.AsyncConnection.connect(dsn)
    await closed.close()
    with pytest.raises(ConnectionUnusable, match="is closed"):
        await async_jobs.enqueue_many("x", [1], connection=closed)
    assert _count(dsn) == 0


def test_sync_client_refuses_a_failed_transaction_and_leaves_it_failed_for_the_caller_to_roll_back(
    sync_jobs: SyncJobsClient, own_conn: Connection[Any], dsn: str
) -> None:
    with pytest.raises(psycopg.errors.DivisionByZero):
        own_conn.execute("SELECT 1/0")
    for call in (lambda: sync_jobs.enqueue("x", 1, connection=own_conn),
                 lambda: sync_jobs.enqueue_many("x", [1], connection=own_conn)):
        with pytest.raises(ConnectionUnusable, match="failed transaction"):
            call()
    assert own_conn.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
    own_conn.rollback()
    sync_jobs.enqueue("x", 1, connection=own_conn)
    own_conn.commit()
    assert _count(dsn) == 1


async def test_both_faces_refuse_a_connection_to_another_database_leaving_its_transaction_as_it_was(
    sync_jobs: SyncJobsClient, async_jobs: JobsClient, empty_dsn: str, dsn: str
) -> None:
    with psycopg.connect(empty_dsn) as other:
        other.execute("CREATE TABLE app_data (x int)")
        with pytest.raises(ConnectionUnusable, match=r"to database .* not to this client's"):
            sync_jobs.enqueue("x", 1, connection=other)
        assert other.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        other.execute("INSERT INTO app_data VALUES (1)")  # the caller's transaction goes on
        other.commit()
    async with await psycopg.AsyncConnection.connect(empty_dsn) as aother:
        with pytest.raises(ConnectionUnusable, match=r"to database .* not to this client's"):
            await async_jobs.enqueue("x", 1, connection=aother)
        assert aother.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert _count(dsn) == 0
    assert query(empty_dsn, "SELECT x FROM app_data") == [(1,)]
