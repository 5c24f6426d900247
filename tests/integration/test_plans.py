"""How PostgreSQL plans the worker's fenced writes of held rows: each row by its primary key, whatever the statistics
say about running rows (a plan that scans every running row of every worker costs O(fleet) per write)."""

from __future__ import annotations

import re

import psycopg
import pytest
from testkit import query

from taskq import sql

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


@pytest.mark.parametrize("name", FENCED_WRITES)
def test_a_fenced_write_finds_its_rows_by_primary_key_even_when_statistics_saw_nothing_running(
    dsn: str, name: str
) -> None:
    # statistics taken while nothing ran (a quiet moment, or a backlog just written): the estimate of
    # running rows is 1, which made the partial index on running rows look cheapest
    query(dsn, "INSERT INTO taskq.jobs (id, actor, payload) SELECT gen_random_uuid(), 'tests.plans', '1'"
               " FROM generate_series(1, 5000)")
    query(dsn, "VACUUM ANALYZE taskq.jobs")
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.info.server_version < 160000:
            pytest.skip("EXPLAIN (GENERIC_PLAN) needs PostgreSQL 16")
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN (GENERIC_PLAN) " + numbered(sql.query(name))))
    assert "jobs_running_lease_idx" not in plan, plan
    assert "jobs_pkey" in plan, plan
