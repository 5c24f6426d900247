"""Each isolation class within its own capacity, in real worker processes: the README's example app with no
settings runs its naps while its process jobs take every core; a worker with one child never holds a
process job it cannot start; a mixed worker still fails an unknown actor's job at once; and the capacity
invariant holds on these runs."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from testkit import query, wait_until

from taskq import SyncJobsClient
from taskq.invariants import check_invariants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

APP = "taskq_capacity_app:actors"


def enqueue_many(dsn: str, actor: str, payloads: list[Any]) -> list[UUID]:
    rows = query(dsn, "INSERT INTO taskq.jobs (actor, payload) SELECT %s, p FROM unnest(%s::jsonb[]) AS p "
                      "RETURNING id", actor, [json.dumps(p) for p in payloads])
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return [UUID(str(r[0])) for r in rows]


def statuses(dsn: str, ids: list[UUID]) -> list[str]:
    return [r[0] for r in query(dsn, "SELECT status FROM taskq.jobs WHERE id = ANY(%s)", ids)]


def all_in(dsn: str, ids: list[UUID], status: str) -> bool:
    return statuses(dsn, ids) == [status] * len(ids)


def capacity_violations(dsn: str) -> list[str]:
    async def run() -> list[str]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            report = await check_invariants(conn)
        return [v.detail for v in report.violations if v.invariant == "inv_class_capacity"]

    return asyncio.run(run())


def test_the_readme_app_with_no_settings_runs_twenty_naps_in_a_second_while_its_process_jobs_take_every_core(
    dsn: str, spawn_worker: Any
) -> None:
    worker = spawn_worker(app="examples.app:actors")
    worker_id = worker.worker_id()
    # long enough to outlast the naps on any machine; cancelled at the end
    primes = enqueue_many(dsn, "examples.sum_primes", [{"below": 400_000_000}] * 2)
    wait_until(lambda: all_in(dsn, primes, "running"), timeout=10)
    naps = enqueue_many(dsn, "examples.nap", [{"seconds": 1}] * 20)
    wait_until(lambda: all_in(dsn, naps, "succeeded"), timeout=15)
    ((elapsed,),) = query(dsn, "SELECT extract(epoch FROM max(finished_at) - min(created_at))::float8 "
                               "FROM taskq.jobs WHERE id = ANY(%s)", naps)
    assert elapsed < 3.0, f"20 one-second naps took {elapsed:.2f}s beside two process jobs"
    assert all_in(dsn, primes, "running"), "the process jobs were supposed to run all along"

    cpus = os.cpu_count() or 1
    assert f"capacity: async=200 thread=16 process={cpus}" in worker.log()
    ((caps, isolation),) = query(dsn, "SELECT ARRAY[concurrency, capacity_async, capacity_thread, capacity_process], "
                                      "actor_isolation FROM taskq.workers WHERE id = %s", worker_id)
    assert caps == [200, 200, 16, cpus]
    assert isolation == {"examples.nap": "async", "examples.sum_primes": "process"}
    assert capacity_violations(dsn) == []

    with SyncJobsClient.connect(dsn) as client:
        for job_id in primes:
            client.cancel(job_id, reason="the test is done")
    wait_until(lambda: all_in(dsn, primes, "cancelled"), timeout=15)


def test_one_child_never_holds_two_process_jobs_and_none_waits_while_fifty_async_slots_run_the_rest(
    dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    started = tmp_path / "started"
    started.mkdir()
    worker = spawn_worker(app=APP, max_children=1, concurrency=50)
    worker.worker_id()
    crunches = enqueue_many(dsn, "cap.crunch", [{"seconds": 0.6, "started": str(started)}] * 10)
    naps = enqueue_many(dsn, "cap.nap", [{"seconds": 0.5}] * 100)
    wait_until(lambda: all_in(dsn, naps + crunches, "succeeded"), timeout=60)

    attempts = query(dsn, "SELECT a.job_id, extract(epoch FROM a.started_at)::float8, "
                          "extract(epoch FROM a.finished_at)::float8 FROM taskq.job_attempts AS a "
                          "WHERE a.job_id = ANY(%s) ORDER BY a.started_at", crunches)
    assert len(attempts) == 10
    for (_, _, finished), (job_id, claimed, _) in itertools.pairwise(attempts):
        assert claimed >= finished, f"process job {job_id} was claimed while another one was held"
    for i, (job_id, claimed, _) in enumerate(attempts):
        gap = float((started / str(job_id)).read_text()) - claimed
        # the first one waits for the child to start; any other waiting for the child would wait 0.6 s
        assert gap < (5.0 if i == 0 else 0.4), f"process job {job_id} started {gap:.2f}s after its claim"
    ((naps_done, crunches_done),) = query(
        dsn, "SELECT max(finished_at) FILTER (WHERE actor = 'cap.nap'), "
             "max(finished_at) FILTER (WHERE actor = 'cap.crunch') FROM taskq.jobs")
    assert naps_done < crunches_done, "the async jobs waited for the process jobs"
    assert capacity_violations(dsn) == []


def test_a_mixed_worker_fails_an_unknown_actors_job_at_once_while_its_process_class_is_full(
    dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    worker = spawn_worker(app=APP, max_children=1)
    worker.worker_id()
    (busy,) = enqueue_many(dsn, "cap.crunch", [{"seconds": 30, "started": str(tmp_path)}])
    wait_until(lambda: (tmp_path / str(busy)).exists(), timeout=10)
    (stray,) = enqueue_many(dsn, "nobody.knows", [{}])
    wait_until(lambda: query(dsn, "SELECT status, error_class FROM taskq.jobs WHERE id = %s", stray)
               == [("failed", "UnknownActor")], timeout=5)
    assert statuses(dsn, [busy]) == ["running"]
    with SyncJobsClient.connect(dsn) as client:
        client.cancel(busy, reason="the test is done")
    wait_until(lambda: statuses(dsn, [busy]) == ["cancelled"], timeout=15)
    assert capacity_violations(dsn) == []
