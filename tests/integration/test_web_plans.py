"""Every list and detail query of the web API and dashboard is index-backed: EXPLAIN shows no sequential
scan of taskq.jobs (nor of the timeline, attempts and audit tables), on a table of 60,000 jobs mostly
finished (as a busy queue's table is), with their events and attempts, analyzed; filters that match
nothing included. The two filters docs/web.md names as scans (an actor filter, a grant pattern with a
leading `*`) are checked to read taskq.jobs only."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import psycopg
import pytest

from taskq import sql
from taskq.backend.web import page_params

BIG_TABLES = ("jobs", "job_events", "job_attempts", "operator_audit")
NOW = datetime.now(UTC)
SOME_ID = uuid4()
PAGE: dict[str, Any] = {
    "statuses": None, "queues": None, "actors": None, "tags": None, "parent_id": None, "created_after": None,
    "created_before": None, "readable": None, "allowed": None, "uncancelled": False, "after_at": None,
    "after_id": None, "limit": 51, "workflow_id": None, "waiting": None,
}
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("job list, no filter", "job_page", PAGE),
    ("job list, next page", "job_page", PAGE | {"after_at": NOW - timedelta(minutes=30), "after_id": SOME_ID}),
    ("job list by status", "job_page", PAGE | {"statuses": ["running"]}),
    ("job list by failure", "job_page", PAGE | {"statuses": ["failed"]}),
    ("job list by queue", "job_page", PAGE | {"queues": ["q3"]}),
    ("job list by queue and status", "job_page", PAGE | {"queues": ["q3"], "statuses": ["pending"]}),
    ("job list by actor", "job_page", PAGE | {"actors": ["actor.7"]}),
    ("job list by tag", "job_page", PAGE | {"tags": ["rare"]}),
    ("job list by parent", "job_page", PAGE | {"parent_id": SOME_ID}),
    ("job list by time window", "job_page",
     PAGE | {"created_after": NOW - timedelta(minutes=10), "created_before": NOW - timedelta(minutes=5)}),
    ("job list, readable queues", "job_page", PAGE | {"readable": ["billing-%", "q1"]}),
    ("job list by a tag and an actor that match nothing", "job_page", PAGE | {"tags": ["rare"], "actors": ["nope"]}),
    ("job list by an unknown tag and actor", "job_page", PAGE | {"tags": ["t-none"], "actors": ["nope"]}),
    ("job list, a prefix grant and a name", "job_page", PAGE | {"readable": ["billing-%", "q1"]}),
    ("scoped bulk selection", "job_page", PAGE | {"statuses": ["pending", "scheduled", "running"],
                                                  "uncancelled": True, "readable": ["q2"], "allowed": ["q2"]}),
    ("bulk cancel selection", "job_page", PAGE | {"statuses": ["pending", "scheduled", "running"],
                                                  "uncancelled": True, "queues": ["q2"]}),
    ("job list by workflow", "job_page", PAGE | {"workflow_id": SOME_ID}),
    ("job list of sleeping jobs", "job_page", PAGE | {"waiting": "sleep"}),
    ("job list of suspended jobs", "job_page", PAGE | {"waiting": "any"}),
    ("a workflow's queues", "workflow_queues", {"workflow_id": SOME_ID}),
    ("a workflow's members", "workflow_members", {"workflow_id": SOME_ID, "limit": 501}),
    ("a workflow's edges", "workflow_edges", {"workflow_id": SOME_ID}),
    ("job detail row", "job_get", {"id": SOME_ID}),
    ("job detail lock", "job_lock", {"id": SOME_ID}),
    ("job detail events", "job_events_page", {"id": SOME_ID, "before": None, "limit": 101}),
    ("job events, next page", "job_events_page", {"id": SOME_ID, "before": 1000, "limit": 51}),
    ("job detail attempts", "job_attempts_newest", {"id": SOME_ID, "limit": 101}),
    ("job detail children", "job_children", {"id": SOME_ID, "limit": 100}),
    ("job detail audit", "audit_for_job", {"id": SOME_ID, "before": None, "limit": 101}),
    ("job audit, next page", "audit_for_job", {"id": SOME_ID, "before": 1000, "limit": 51}),
    ("a queue limit's queue check", "queue_known", {"name": "q3"}),
    ("cancels in flight", "jobs_cancelling", {"readable": None, "limit": 500}),
    ("overview depth", "stats_depth", {"readable": None}),
    ("overview depth, readable queues", "stats_depth", {"readable": ["billing-%", "q1"]}),
    ("overview last hour", "stats_recent", {"readable": None, "minutes": 60}),
    ("workers", "workers_list", {"readable": None}),
    ("workers, readable queues", "workers_list", {"readable": ["q1"]}),
    ("a worker's held jobs", "worker_held_jobs", {"id": "w1", "limit": 100}),
]


@pytest.fixture(scope="module")
def big_dsn(module_dsn: str) -> str:
    dsn = module_dsn
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("""
            INSERT INTO taskq.jobs (actor, queue, payload, status, tags, created_at, scheduled_at, started_at,
                                    finished_at, worker_id, lock_expires_at, attempt, claim_epoch,
                                    cancel_requested_at, parent_id)
            SELECT 'actor.' || (i % 20), 'q' || (i % 10), '{}',
                   s.status, CASE WHEN i % 5000 = 0 THEN '{rare}'::text[] ELSE '{}'::text[] END,
                   now() - (60000 - i) * interval '50 ms', now() - (60000 - i) * interval '50 ms',
                   CASE WHEN s.status NOT IN ('pending', 'scheduled') THEN now() - (60000 - i) * interval '50 ms' END,
                   CASE WHEN s.status NOT IN ('pending', 'scheduled', 'running') THEN now() END,
                   CASE WHEN s.status = 'running' THEN 'w' || (i % 4) END,
                   CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END,
                   CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END, CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
                   CASE WHEN s.status = 'cancelled' OR (s.status = 'running' AND i % 7 = 0) THEN now() END,
                   CASE WHEN i % 1000 = 0 THEN gen_random_uuid() END
            FROM generate_series(1, 60000) AS i
            CROSS JOIN LATERAL (SELECT CASE WHEN i > 59000 THEN 'pending' WHEN i > 58800 THEN 'running'
                                            WHEN i % 50 = 0 THEN 'failed' WHEN i % 77 = 0 THEN 'cancelled'
                                            ELSE 'succeeded' END AS status) AS s
        """)
        conn.execute("INSERT INTO taskq.job_events (job_id, kind, from_status, to_status) "
                     "SELECT id, 'state_change', 'pending', status FROM taskq.jobs")
        conn.execute("INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
                     "SELECT id, 1, 1, 'w1' FROM taskq.jobs WHERE attempt = 1")
        conn.execute("INSERT INTO taskq.operator_audit (principal, action, outcome, job_id) "
                     "SELECT 'ops', 'jobs:cancel', 'cancelled', id FROM taskq.jobs WHERE status = 'cancelled'")
        conn.execute("INSERT INTO taskq.workers (id, host, pid, queues, concurrency) "
                     "SELECT 'w' || i, 'h', i, '{q1}', 10 FROM generate_series(0, 3) AS i")
        conn.execute("ANALYZE")
    return dsn


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


def plan_of(dsn: str, name: str, params: dict[str, Any]) -> dict[str, Any]:
    if name == "job_page":
        params = page_params(params)
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(b"EXPLAIN (FORMAT JSON) " + sql.query(name).encode(), params, prepare=False).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


DOCUMENTED_SCANS: list[tuple[str, str, dict[str, Any]]] = [
    # no index of taskq.jobs leads with actor (jobs_claim_actor_idx holds waiting rows only), and a LIKE
    # pattern with a leading wildcard cannot use a btree: docs/web.md ("Performance") names both
    ("job list by an actor that matches nothing", "job_page", PAGE | {"actors": ["nope"]}),
    ("job list, a suffix grant", "job_page", PAGE | {"readable": ["%zzz"]}),
]


@pytest.mark.parametrize(("what", "name", "params"), CASES, ids=[c[0] for c in CASES])
def test_web_query_reads_jobs_through_an_index(big_dsn: str, what: str, name: str, params: dict[str, Any]) -> None:
    plan = plan_of(big_dsn, name, params)
    scans = [n for n in _nodes(plan) if n.get("Relation Name") in BIG_TABLES]
    seq = [n["Relation Name"] for n in scans if n["Node Type"] == "Seq Scan"]
    assert not seq, f"{what}: sequential scan of {seq} in {plan}"
    assert scans, f"{what}: the plan reads none of {BIG_TABLES}? {plan}"


@pytest.mark.parametrize(("what", "name", "params"), DOCUMENTED_SCANS, ids=[c[0] for c in DOCUMENTED_SCANS])
def test_the_documented_scans_read_only_the_jobs_table(big_dsn: str, what: str, name: str,
                                                       params: dict[str, Any]) -> None:
    """The filters docs/web.md says are a scan of taskq.jobs: that scan, bounded by the page's LIMIT once
    enough rows match, and by the web pool's statement_timeout when none does; no other table is read."""
    plan = plan_of(big_dsn, name, params)
    scans = [n for n in _nodes(plan) if n.get("Relation Name")]
    assert scans and {n["Relation Name"] for n in scans} == {"jobs"}, plan
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "web.md").read_text()
    assert ("an `actor` filter" in docs and "a grant pattern that starts with `*`" in docs), \
        "docs/web.md must name the filters that stay a scan"


def test_the_cases_cover_every_jobs_query_of_the_web_layer() -> None:
    from pathlib import Path

    text = (Path(sql.__file__).parent / "web.sql").read_text()
    names = {line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("-- name:")}
    reading_jobs = {n for n in names if "taskq.jobs" in sql.query(n)}
    assert reading_jobs <= {c[1] for c in CASES}, reading_jobs - {c[1] for c in CASES}

