"""How PostgreSQL plans the worker's fenced writes of held rows: each row by its primary key, whatever the statistics
say about running rows (a plan that scans every running row of every worker costs O(fleet) per write)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from testkit import query

from taskq import sql
from taskq.backend.core import Backend
from taskq.backend.workers import WorkerStore

pytestmark = pytest.mark.timeout(60)

FENCED_WRITES = ["job_finish_batch", "job_release_batch", "job_progress", "job_cancel_escalate"]


def numbered(text: str) -> str:
    """The named query with psycopg's %(name)s / %(name)b placeholders as $1, $2... (for EXPLAIN)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)[sb]", number, text).replace("%%", "%")


def _backlog(dsn: str, jobs: int) -> None:
    """`jobs` pending rows, and statistics taken while none ran (the estimate of running rows is 1)."""
    query(dsn, "INSERT INTO taskq.jobs (id, actor, payload) SELECT gen_random_uuid(), 'tests.plans', '1'"
               " FROM generate_series(1, %s)", jobs)
    query(dsn, "VACUUM ANALYZE taskq.jobs")


@contextlib.asynccontextmanager
async def _worker_store(dsn: str, concurrency: int) -> AsyncIterator[tuple[Backend, WorkerStore]]:
    backend = await Backend.open(dsn, min_size=1, max_size=1, worker_id="plans-worker")
    try:
        store = WorkerStore(backend, "plans-worker")
        await store.register(["default"], concurrency, 60.0)
        yield backend, store
    finally:
        await backend.close()


@pytest.mark.parametrize("name", FENCED_WRITES)
def test_a_fenced_write_finds_its_rows_by_primary_key_even_when_statistics_saw_nothing_running(
    dsn: str, name: str
) -> None:
    # statistics taken while nothing ran (a quiet moment, or a backlog just written): the estimate of
    # running rows is 1, which made the partial index on running rows look cheapest
    _backlog(dsn, 5000)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.info.server_version < 160000:
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16")
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN (GENERIC_PLAN) " + numbered(sql.query(name))))
    assert "jobs_running_lease_idx" not in plan, plan
    assert "jobs_pkey" in plan, plan


@pytest.mark.parametrize("name", ["job_list", "job_cancel_where_batch", "job_requeue_where_batch", "job_page"])
def test_a_tag_filter_finds_tagged_jobs_through_the_partial_tags_index(dsn: str, name: str) -> None:
    # jobs_tags_idx holds tagged rows only (schema 20): each filter on tags must let the planner prove its
    # predicate, or a rare tag is looked for row by row among the untagged backlog
    # as many untagged rows in each status the filters select (pending for a cancel, failed for a requeue)
    # as tagged ones are rare
    for tags, rows in (("'{}'", 10_000), ("ARRAY['rare']", 5)):
        query(dsn, "INSERT INTO taskq.jobs (id, actor, payload, tags) SELECT gen_random_uuid(), 'tests.plans', '1',"
                   f" {tags} FROM generate_series(1, {rows})")
        query(dsn, "INSERT INTO taskq.jobs (id, actor, payload, tags, status, finished_at) SELECT gen_random_uuid(),"
                   f" 'tests.plans', '1', {tags}, 'failed', now() FROM generate_series(1, {rows})")
    query(dsn, "VACUUM ANALYZE taskq.jobs")
    text = sql.query(name)
    params: dict[str, Any] = {p: None for p in re.findall(r"%\((\w+)\)[sb]", text)}
    params.update(tags=["rare"], limit=50)
    with psycopg.connect(dsn, autocommit=True) as conn:
        # an unnamed statement: planned with these values (as the client's first executions are)
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + text, params))
    assert "jobs_tags_idx" in plan, plan


async def test_the_worker_claim_keeps_a_generic_plan_with_a_long_backlog(dsn: str) -> None:
    # with the limit as a parameter, PostgreSQL judged the generic plan dear behind a long backlog and planned
    # every claim again; written in (claim_statement), each claim size keeps one generic plan
    _backlog(dsn, 50000)
    async with _worker_store(dsn, 10) as (backend, store):
        claimed = 0
        for _ in range(20):
            claimed += len(await store.claim(["default"], 10, 60.0))
        async with backend.pool.connection() as conn:
            cur = await conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements"
                                     " WHERE statement LIKE '%%INSERT INTO taskq.job_attempts%%'")
            plans = await cur.fetchall()
    assert claimed == 200
    assert len(plans) == 1, plans  # one claim size: one statement
    generic, custom = plans[0]
    assert custom <= 5 and generic >= 10, plans  # psycopg prepares it at its 5th run; PostgreSQL plans it 5 times


def _held_params(name: str, claimed: list[Any]) -> dict[str, Any]:
    """What the worker sends for `name` with these claimed rows (all succeeded, none unsafe)."""
    n = len(claimed)
    held = {"worker_id": "plans-worker", "ids": [j.id for j in claimed], "epochs": [j.claim_epoch for j in claimed]}
    if name == "heartbeat_reconcile":
        return held | {"lock_timeout": 60.0}
    held["attempts"] = [j.attempt for j in claimed]
    if name == "job_release_batch":
        return held | {"unsafe": [False] * n}
    return held | {"statuses": ["succeeded"] * n, "results": ["null"] * n, "error_classes": [None] * n,
                   "error_messages": [None] * n, "retry_delays": [None] * n, "outcomes": ["succeeded"] * n,
                   "details": [None] * n, "first_traces": [None] * n, "wait_kinds": [None] * n,
                   "wait_signals": [None] * n}


@pytest.mark.parametrize("name", ["job_finish_batch", "job_release_batch", "heartbeat_reconcile"])
async def test_a_wide_batch_of_held_rows_is_locked_by_primary_key_not_by_a_scan_of_jobs(dsn: str, name: str) -> None:
    # joined with the batch, the lock step of these statements turned to a sequential scan of jobs (and a
    # nested loop over the batch for every row) from about 200 rows a batch: among 20,000 jobs a finish of
    # 500 rows took 79 ms against 12, a shutdown's release of 1,000 held rows 179 ms against 27
    _backlog(dsn, 5000)
    async with _worker_store(dsn, 500) as (_, store):
        claimed = await store.claim(["default"], 500, 60.0)
    assert len(claimed) == 500
    with psycopg.connect(dsn, autocommit=True) as conn:
        # planned with these values, as each new batch size is
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql.query(name), _held_params(name, claimed)))
    assert "Seq Scan on jobs" not in plan, plan
    assert plan.count("jobs_pkey") >= 2, plan  # the lock step and the update, each by primary key
