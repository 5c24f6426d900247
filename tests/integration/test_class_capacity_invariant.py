"""The invariant inv_class_capacity: no worker ever held more jobs of an isolation class than its capacity,
read from the attempts rows and the worker's registered capacities. Rows written by hand: a worker that
held two process jobs at once with one child is caught; back-to-back attempts are not."""

from __future__ import annotations

import json
from uuid import UUID

import psycopg
from testkit import query

from taskq.invariants import check_invariants

T0 = "2026-01-01 00:00:00+00"


def worker_row(dsn: str, worker_id: str, isolation: dict[str, str] | None, *, capacity_async: int = 2,
               capacity_thread: int = 1, capacity_process: int = 1) -> None:
    query(dsn, "INSERT INTO taskq.workers (id, host, pid, queues, concurrency, capacity_async, capacity_thread, "
               "capacity_process, actor_isolation) VALUES (%s, 'h', 1, '{default}', %s, %s, %s, %s, %s::jsonb)",
          worker_id, capacity_async, capacity_async, capacity_thread, capacity_process,
          None if isolation is None else json.dumps(isolation))


def held(dsn: str, worker_id: str, actor: str, start: float, end: float | None) -> UUID:
    """One job of `actor` held by `worker_id` from `start` to `end` seconds after T0 (None: still held)."""
    ((job_id,),) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES (%s, '{}') RETURNING id", actor)
    query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at, finished_at) "
               "VALUES (%s, 1, 1, %s, %s::timestamptz + %s * interval '1 second', "
               "%s::timestamptz + %s * interval '1 second')",
          job_id, worker_id, T0, start, T0, end)
    return UUID(str(job_id))


async def capacity_violations(dsn: str) -> list[tuple[UUID, str]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn)
    return [(v.job_id, v.detail) for v in report.violations if v.invariant == "inv_class_capacity"]


MIXED = {"app.crunch": "process", "app.build": "thread", "app.nap": "async"}


async def test_a_worker_that_held_two_process_jobs_with_one_child_is_caught(dsn: str) -> None:
    worker_row(dsn, "w1", MIXED)
    held(dsn, "w1", "app.crunch", 0, 10)
    second = held(dsn, "w1", "app.crunch", 5, 12)
    found = await capacity_violations(dsn)
    assert len(found) == 1
    job_id, detail = found[0]
    assert job_id == second
    assert "worker w1 held 2 process jobs at once" in detail and "process capacity (1)" in detail


async def test_back_to_back_attempts_and_other_classes_jobs_do_not_count_against_a_class(dsn: str) -> None:
    worker_row(dsn, "w1", MIXED)
    held(dsn, "w1", "app.crunch", 0, 5)
    held(dsn, "w1", "app.crunch", 5, 9)  # claimed at the instant the previous outcome was written
    held(dsn, "w1", "app.build", 1, 8)
    held(dsn, "w1", "app.nap", 2, None)  # still held
    assert await capacity_violations(dsn) == []


async def test_async_rows_may_reach_twice_the_capacity_while_outcomes_are_written_and_no_more(dsn: str) -> None:
    worker_row(dsn, "w1", MIXED, capacity_async=2)
    for i in range(4):
        held(dsn, "w1", "app.nap", i * 0.1, 10)
    assert await capacity_violations(dsn) == []
    held(dsn, "w1", "nobody.knows", 1, 2)  # an unknown actor's job counts on a mixed worker's async class
    ((_, detail),) = await capacity_violations(dsn)
    assert "held 5 async jobs at once" in detail and "async capacity (2, twice that allowed" in detail


async def test_a_worker_of_one_class_counts_an_unknown_actors_job_on_that_class(dsn: str) -> None:
    worker_row(dsn, "w1", {"app.crunch": "process"}, capacity_process=1)
    held(dsn, "w1", "app.crunch", 0, 10)
    held(dsn, "w1", "nobody.knows", 1, 2)
    ((_, detail),) = await capacity_violations(dsn)
    assert "held 2 process jobs" in detail


async def test_workers_that_registered_no_classes_and_other_workers_attempts_are_left_alone(dsn: str) -> None:
    worker_row(dsn, "old", None)
    held(dsn, "old", "app.crunch", 0, 10)
    held(dsn, "old", "app.crunch", 1, 10)
    worker_row(dsn, "w1", MIXED)
    worker_row(dsn, "w2", MIXED)
    held(dsn, "w1", "app.crunch", 0, 10)
    held(dsn, "w2", "app.crunch", 0, 10)
    assert await capacity_violations(dsn) == []
