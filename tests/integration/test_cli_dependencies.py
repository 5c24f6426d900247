"""`taskq enqueue --depends-on`, `taskq job ID` with parents and children, `taskq jobs --status
awaiting_parents`, `taskq requeue --cascade`: the real CLI in a subprocess against a real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from test_cli import enqueue, job_json, ok, run_cli
from testkit import query

pytestmark = pytest.mark.timeout(120)


def test_enqueue_with_parents_waits_and_job_shows_parents_and_children(dsn: str) -> None:
    first = enqueue(dsn, "cli.parent", 1, "--queue", "nobody")
    second = enqueue(dsn, "cli.parent", 2, "--queue", "nobody")
    out = ok(run_cli("enqueue", "cli.child", "--payload", "3", "--depends-on", first, "--depends-on", second,
                     "--dependency-mode", "on_any_terminal", "--json", dsn=dsn))
    child = json.loads(out)
    assert (child["status"], child["parents_remaining"], child["dependency_mode"]) == (
        "awaiting_parents", 2, "on_any_terminal")
    listed = ok(run_cli("jobs", "--status", "awaiting_parents", dsn=dsn))
    assert child["id"] in listed and first not in listed
    ok(run_cli("cancel", first, dsn=dsn))
    detail = ok(run_cli("job", child["id"], dsn=dsn))
    assert "parents (2)" in detail and "children (0)" in detail
    parent_lines = [line for line in detail.splitlines() if first in line]
    assert parent_lines and "cancelled" in parent_lines[0]
    assert "children (1)" in ok(run_cli("job", first, dsn=dsn))
    data = job_json(dsn, child["id"])
    assert {p["job_id"]: p["parent_status"] for p in data["dependencies"]["parents"]} == {first: "cancelled",
                                                                                           second: None}
    assert data["job"]["parents_remaining"] == 1


def test_requeue_with_cascade_brings_back_the_cancelled_children(dsn: str) -> None:
    parent = enqueue(dsn, "cli.parent", 1, "--queue", "nobody")
    child = enqueue(dsn, "cli.child", 2, "--depends-on", parent)
    query(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", parent)
    assert job_json(dsn, child)["job"]["cancel_reason"] == "parent-failure:failed"
    out = ok(run_cli("requeue", parent, "--cascade", dsn=dsn))
    assert "1 dependent job(s) wait for it again" in out
    assert job_json(dsn, child)["job"]["status"] == "awaiting_parents"
