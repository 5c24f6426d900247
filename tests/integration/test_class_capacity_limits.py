"""A mixed worker under queue limits: the limited claim runs once per isolation class with free slots, so
a queue limit is shared among the classes without a class passing its own capacity."""

from __future__ import annotations

import itertools
from pathlib import Path

import psycopg
from apps import taskq_capacity_app as app
from testkit import query, running_worker, wait_for

from taskq.client import JobsClient
from taskq.invariants import check_invariants


async def violations(dsn: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn)
    return [f"{v.invariant}: {v.detail}" for v in report.violations
            if v.invariant in ("inv_class_capacity", "inv_global_limit")]


async def test_a_limited_queue_on_a_mixed_worker_never_gets_two_process_jobs_held_with_one_child(
    dsn: str, client: JobsClient, tmp_path: Path
) -> None:
    await client.set_queue_limits("default", concurrency=20)
    async with running_worker(dsn, app.actors, max_children=1, concurrency=50) as worker:
        await wait_for(lambda: worker.parts.control.limited)  # its first claim read the limit
        crunches = [await client.enqueue(app.crunch, app.Crunch(seconds=0.3, started=str(tmp_path)))
                    for _ in range(4)]
        naps = [await client.enqueue(app.nap, app.Nap(seconds=0.3)) for _ in range(30)]
        for handle in crunches + naps:
            assert (await handle.wait(timeout=30)).status.value == "succeeded"
        attempts = query(dsn, "SELECT started_at, finished_at FROM taskq.job_attempts WHERE job_id = ANY(%s) "
                              "ORDER BY started_at", [h.job_id for h in crunches])
        assert len(attempts) == 4
        for (_, finished), (claimed, _) in itertools.pairwise(attempts):
            assert claimed >= finished, "a second process job was claimed while the only child was busy"
        assert await violations(dsn) == []
