"""Each limited claim statement holds its limit against a concurrent claimer, by a deterministic
interleaving on a real PostgreSQL (no timing involved):

1. claimer A runs the limited claim inside an open transaction and takes the one slot the limit leaves;
2. claimer B starts the same claim while A has not committed;
3. once B is waiting on a lock (or has already returned: a claim without its guard), A commits;
4. B must come back with nothing: its count has to see A's commit.

Without the scope lock B does not wait, skips A's locked rows and takes a second job. With a lock taken
in the same statement as the count, B waits but counts from a snapshot older than A's commit, and takes
a second job too. Either way the total is 2 under a limit of 1, and the test fails. (The sampling test
of tests/system/test_queue_control_processes.py could miss a missing guard: that needs two claims of
one scope to overlap, which a light queue rarely makes.)
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from testkit import wait_for

from taskq import sql
from taskq.backend import Backend
from taskq.backend.workers import WorkerStore

pytestmark = pytest.mark.timeout(120)

QUEUE = "lim"
ACTOR = "exact.job"
SCAN = 50
BACKLOG = 3 * SCAN
"""More jobs than a claim's scan locks (the general claim locks up to `scan` rows, keeps what its limits
allow and unlocks the rest at commit): B must find unlocked jobs, or it would take nothing whatever the
guard."""


@dataclass(frozen=True)
class Case:
    statement: str
    setup: tuple[str, ...]
    key: str | None = None


CASES = {
    "queue concurrency, light claim": Case("job_claim_queue_limited", (
        f"UPDATE taskq.queues SET concurrency_limit = 1 WHERE name = '{QUEUE}'",)),
    "queue concurrency, general claim": Case("job_claim_limited", (
        f"UPDATE taskq.queues SET concurrency_limit = 1 WHERE name = '{QUEUE}'",)),
    "queue rate, light claim": Case("job_claim_queue_limited", (
        f"UPDATE taskq.queues SET rate_limit = 1, rate_period = 3600 WHERE name = '{QUEUE}'",)),
    "queue rate, general claim": Case("job_claim_limited", (
        f"UPDATE taskq.queues SET rate_limit = 1, rate_period = 3600 WHERE name = '{QUEUE}'",)),
    "queue per key": Case("job_claim_limited", (
        f"UPDATE taskq.queues SET concurrency_per_key = 1 WHERE name = '{QUEUE}'",), key="tenant-1"),
    "actor concurrency": Case("job_claim_limited", (
        f"INSERT INTO taskq.actor_limits (actor, global_concurrency) VALUES ('{ACTOR}', 1)",)),
    "actor per key": Case("job_claim_limited", (
        f"INSERT INTO taskq.actor_limits (actor, concurrency_per_key) VALUES ('{ACTOR}', 1)",), key="tenant-1"),
    "actor rate": Case("job_claim_limited", (
        f"INSERT INTO taskq.actor_limits (actor, rate_limit, rate_period) VALUES ('{ACTOR}', 1, 3600)",)),
}


@pytest.fixture
async def workers(dsn: str) -> AsyncIterator[list[str]]:
    backend = await Backend.open(dsn, min_size=1, max_size=2)
    try:
        for name in ("exact-a", "exact-b"):
            await WorkerStore(backend, name).register([QUEUE], 10, 600.0)
        yield ["exact-a", "exact-b"]
    finally:
        await backend.close()


def params(worker: str) -> dict[str, Any]:
    return {"queues": [QUEUE], "limit": 5, "scan": SCAN, "worker_id": worker, "lock_timeout": 600.0,
            "only": None, "except": None}


async def waiting_on_lock_or_done(conn: psycopg.AsyncConnection[Any], pid: int, task: asyncio.Task[Any]) -> bool:
    if task.done():
        return True
    cur = await conn.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,))
    row = await cur.fetchone()
    return row is not None and row[0] == "Lock"


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
async def test_a_second_claimer_sees_the_first_claimers_commit(dsn: str, workers: list[str], case: str) -> None:
    spec = CASES[case]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as b:
        for statement in spec.setup:  # the workers' registration made the queue's row
            cur = await admin.execute(statement)
            assert cur.rowcount == 1
        await admin.execute(
            "INSERT INTO taskq.jobs (actor, queue, payload, concurrency_key) "
            "SELECT %s, %s, to_jsonb(i), %s FROM generate_series(1, %s) AS i", (ACTOR, QUEUE, spec.key, BACKLOG))
        cur = await b.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        b_pid = int(row[0])

        async def claim_b() -> list[Any]:
            cur = await b.execute(sql.query(spec.statement), params(workers[1]))
            return await cur.fetchall()

        async with a.transaction():
            cur = await a.execute(sql.query(spec.statement), params(workers[0]))
            first = await cur.fetchall()
            assert len(first) == 1, f"{case}: the first claim should take the one free slot, took {len(first)}"
            second = asyncio.create_task(claim_b())
            try:
                await wait_for(lambda: waiting_on_lock_or_done(admin, b_pid, second), timeout=30)
            except BaseException:
                second.cancel()
                raise
        # A committed (end of its transaction block): B, if it waited, counts now
        got = await asyncio.wait_for(second, timeout=30)
        cur = await admin.execute("SELECT count(*) FROM taskq.jobs WHERE status = 'running'")
        row = await cur.fetchone()
        assert row is not None
        assert not got and row[0] == 1, (
            f"{case}: a limit of 1 let a concurrent claimer take {len(got)} more "
            f"({row[0]} running): its count did not see the first claimer's commit")


async def test_a_pause_waits_for_the_limited_claim_in_progress(dsn: str, workers: list[str]) -> None:
    """The operator's pause takes the queue's claim lock: it commits after the claim in progress, and
    the claims after it see it (the pause test of the system tests allows 100 ms; this is the order)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as a, \
            await psycopg.AsyncConnection.connect(dsn, autocommit=True) as op:
        await admin.execute(f"UPDATE taskq.queues SET concurrency_limit = 5 WHERE name = '{QUEUE}'")
        await admin.execute("INSERT INTO taskq.jobs (actor, queue, payload) SELECT %s, %s, to_jsonb(i) "
                            "FROM generate_series(1, 20) AS i", (ACTOR, QUEUE))
        cur = await op.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        op_pid = int(row[0])

        async def pause() -> None:
            await op.execute(sql.query("queue_set_paused"),
                             {"name": QUEUE, "paused": True, "by": "test", "reason": "exactness"})

        async with a.transaction():
            cur = await a.execute(sql.query("job_claim_queue_limited"), params(workers[0]))
            assert len(await cur.fetchall()) == 5
            paused = asyncio.create_task(pause())
            try:
                await wait_for(lambda: waiting_on_lock_or_done(admin, op_pid, paused), timeout=30)
            except BaseException:
                paused.cancel()
                raise
            assert not paused.done(), "the pause committed while a limited claim of its queue was in progress"
        await asyncio.wait_for(paused, timeout=30)
        cur = await admin.execute(sql.query("job_claim_queue_limited"), params(workers[1]))
        assert await cur.fetchall() == [], "a claim after the pause's commit took work of the paused queue"
