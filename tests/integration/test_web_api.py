"""The /api/v1 JSON API against a real `taskq web` process (httpx over loopback) and a real database:
auth (401/403), the cancel status codes, idempotent replays and key reuse, expected_revision conflicts,
the audit row in the change's transaction, keyset pages under inserts, and bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from testkit import WebServer, query, wait_until

from taskq.backend import Backend
from taskq.ops.tokens import create_token


@dataclass
class Api:
    url: str
    tokens: dict[str, str]
    dsn: str

    def client(self, token: str | None = "admin") -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {self.tokens[token]}"} if token else {}
        return httpx.AsyncClient(base_url=self.url + "/api/v1", headers=headers, timeout=30)


GRANTS = {
    "admin": ["*@*"],
    "reader": ["jobs:read@*"],
    "billing": ["jobs:read@billing-*", "jobs:cancel@billing-*", "jobs:enqueue@billing-*"],
    "billing-ops": ["jobs:read@*", "queues:write@billing-*"],
}


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[WebServer]:
    web = WebServer(dsn, "--cancellation-grace-period", "30", "--cleanup-grace-period", "10",
                    log_path=tmp_path / "web.log")
    try:
        yield web
    finally:
        web.stop()


@pytest.fixture
async def api(dsn: str, server: WebServer) -> AsyncIterator[Api]:
    backend = await Backend.open(dsn)
    try:
        tokens = {name: (await create_token(backend, name, grants))[1] for name, grants in GRANTS.items()}
    finally:
        await backend.close()
    query(dsn, "DELETE FROM taskq.operator_audit")  # the tokens:create rows: each test counts its own
    yield Api(server.url, tokens, dsn)


def job(dsn: str, queue: str = "default", status: str = "pending", **extra: Any) -> UUID:
    """A job row in `status`, written as the runtime would leave it (the worker is not under test here)."""
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload) VALUES ('web.test', %s, '{}') RETURNING id",
                   queue)
    jid = UUID(str(row[0]))
    if status == "running":
        query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'running', attempt = 1, claim_epoch = 1,"
                   " worker_id = 'w1', lock_expires_at = now() + interval '1 hour', started_at = now() WHERE id = %s",
              jid)
    elif status == "scheduled":
        query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'scheduled',"
                   " scheduled_at = now() + interval '1 day' WHERE id = %s", jid)
    elif status != "pending":
        query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = %s, finished_at = now(),"
                   " cancel_requested_at = CASE WHEN %s = 'cancelled' THEN now() END WHERE id = %s",
              status, status, jid)
    return jid


def row(dsn: str, jid: UUID) -> dict[str, Any]:
    (found,) = query(dsn, "SELECT to_jsonb(j) FROM taskq.jobs AS j WHERE id = %s", jid)
    value: dict[str, Any] = found[0]
    return value


def audit_rows(dsn: str, jid: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT principal, action, outcome, reason, request_id FROM taskq.operator_audit"
                      " WHERE job_id = %s ORDER BY id", jid)


def assert_problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["code"] == code and body["detail"] and body["title"]
    assert body["type"].startswith("urn:taskq:problem:")
    return body


# -- auth ----------------------------------------------------------------------------------------------

async def test_no_token_or_an_unknown_token_answers_401(api: Api) -> None:
    jid = job(api.dsn)
    async with api.client(None) as c:
        assert_problem(await c.get("/jobs"), 401, "UNAUTHENTICATED")
        assert_problem(await c.post(f"/jobs/{jid}:cancel"), 401, "UNAUTHENTICATED")
        bad = await c.get("/jobs", headers={"Authorization": "Bearer tq_not-a-token"})
        assert_problem(bad, 401, "UNAUTHENTICATED")
        assert bad.headers["www-authenticate"].startswith("Bearer")
        assert_problem(await c.get("/jobs", headers={"Authorization": "Basic eDp5"}), 401, "UNAUTHENTICATED")
    assert row(api.dsn, jid)["status"] == "pending"


async def test_a_grant_that_misses_the_action_or_the_queue_answers_403_and_changes_nothing(api: Api) -> None:
    default_job = job(api.dsn, "default")
    billing_job = job(api.dsn, "billing-eu")
    async with api.client("reader") as c:
        assert_problem(await c.post(f"/jobs/{default_job}:cancel"), 403, "PERMISSION_DENIED")
    async with api.client("billing") as c:  # a job it may neither read nor act on: 404, as if absent
        assert_problem(await c.post(f"/jobs/{default_job}:cancel"), 404, "NOT_FOUND")
        assert_problem(await c.get(f"/jobs/{default_job}"), 404, "NOT_FOUND")
        assert_problem(await c.post("/jobs", json={"actor": "x", "queue": "default"}), 403, "PERMISSION_DENIED")
        assert_problem(await c.post(f"/jobs/{billing_job}:requeue"), 403, "PERMISSION_DENIED")
        assert (await c.post(f"/jobs/{billing_job}:cancel")).status_code == 200
    assert row(api.dsn, default_job)["status"] == "pending" and row(api.dsn, default_job)["revision"] == 1
    assert audit_rows(api.dsn, default_job) == []


async def test_lists_show_only_the_queues_the_token_may_read(api: Api) -> None:
    mine = {job(api.dsn, "billing-eu"), job(api.dsn, "billing-us")}
    job(api.dsn, "default")
    job(api.dsn, "billing")  # 'billing-*' needs the dash
    async with api.client("billing") as c:
        listed = (await c.get("/jobs")).json()["jobs"]
        stats = (await c.get("/stats")).json()
    assert {UUID(j["id"]) for j in listed} == mine
    assert set(stats["queues"]) == {"billing-eu", "billing-us"}


async def test_a_revoked_token_stops_working(api: Api, dsn: str) -> None:
    async with api.client("reader") as c:
        assert (await c.get("/jobs")).status_code == 200
        done = subprocess.run(  # noqa: ASYNC221 - the CLI under test, briefly
            [sys.executable, "-m", "taskq.cli", "--dsn", dsn, "tokens", "revoke", "reader"],
            capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "reader: revoked"

        async def refused() -> bool:
            return (await c.get("/jobs")).status_code == 401

        from testkit import wait_for

        await wait_for(refused, timeout=20, interval=0.5)


async def test_a_write_by_a_token_revoked_while_cached_answers_401_and_changes_nothing(api: Api, dsn: str) -> None:
    """The web process still holds the principal (its 5 s cache) when the token is revoked; the database's
    audit function refuses the write's audit row, so the write rolls back and the answer is 401, not 500."""
    target = job(dsn, "billing-eu")
    async with api.client("billing") as c:
        assert (await c.get(f"/jobs/{target}")).status_code == 200  # the principal is now cached
        query(dsn, "SELECT taskq.token_revoke_v15('billing', NULL)")
        answer = await c.post(f"/jobs/{target}:cancel", json={"reason": "after revoke"})
        assert answer.status_code == 401, answer.text
        assert (await c.get(f"/jobs/{target}")).status_code == 401  # the cached principal was dropped
    assert query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", target) == [("pending",)]
    assert query(dsn, "SELECT count(*) FROM taskq.operator_audit WHERE job_id = %s", target) == [(0,)]


# -- cancel status codes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("status", ["pending", "scheduled"])
async def test_cancel_of_a_waiting_job_answers_200_with_the_cancelled_row(api: Api, status: str) -> None:
    jid = job(api.dsn, status=status)
    async with api.client() as c:
        r = await c.post(f"/jobs/{jid}:cancel", json={"reason": "operator says so"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["job"]["status"] == "cancelled" and body["job"]["error_class"] == "CancelledBeforeStart"
    assert body["previous_status"] == status
    assert body["job"]["revision"] == row(api.dsn, jid)["revision"] > (2 if status == "scheduled" else 1)
    assert r.headers["etag"] == f'"{body["job"]["revision"]}"'


async def test_cancel_of_a_running_job_answers_202_with_cancel_phase_1(api: Api) -> None:
    jid = job(api.dsn, status="running")
    async with api.client() as c:
        r = await c.post(f"/jobs/{jid}:cancel", json={"reason": "stop"})
        again = await c.post(f"/jobs/{jid}:cancel", json={"reason": "stop again"})
    assert r.status_code == 202, r.text
    assert r.json()["job"]["status"] == "running" and r.json()["job"]["cancel_phase"] == 1
    assert r.headers["location"].endswith(f"/api/v1/jobs/{jid}")
    # a cancel already in flight: a new operation is a conflict, with the row
    body = assert_problem(again, 409, "STATE_CONFLICT")
    assert body["job"]["cancel_reason"] == "stop"


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled", "crashed", "abandoned"])
async def test_cancel_of_a_finished_job_answers_409_state_conflict_with_the_row(api: Api, status: str) -> None:
    jid = job(api.dsn, status=status)
    before = row(api.dsn, jid)
    async with api.client() as c:
        body = assert_problem(await c.post(f"/jobs/{jid}:cancel"), 409, "STATE_CONFLICT")
    assert body["job"]["status"] == status and body["job"]["revision"] == before["revision"]
    assert row(api.dsn, jid) == before


# -- idempotency ---------------------------------------------------------------------------------------

async def test_a_replay_returns_the_first_status_and_body_marked_as_a_replay(api: Api) -> None:
    jid = job(api.dsn, status="running")
    key = str(uuid4())
    async with api.client() as c:
        first = await c.post(f"/jobs/{jid}:cancel", json={"reason": "r"}, headers={"Idempotency-Key": key})
        # the job moves on (its worker ends it cancelled); the stored 202 still replays unchanged
        query(api.dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'cancelled', finished_at = now()"
                       " WHERE id = %s", jid)
        again = await c.post(f"/jobs/{jid}:cancel", json={"reason": "r"}, headers={"Idempotency-Key": f'"{key}"'})
    assert first.status_code == 202 and "idempotent-replayed" not in first.headers
    assert again.status_code == 202 and again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert len(audit_rows(api.dsn, jid)) == 1  # the replay did not act again


async def test_a_key_reused_with_another_request_answers_422_and_changes_nothing(api: Api) -> None:
    jid, other = job(api.dsn), job(api.dsn)
    async with api.client() as c:
        first = await c.post(f"/jobs/{jid}:cancel", json={"reason": "a"}, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == 200
        assert_problem(await c.post(f"/jobs/{jid}:cancel", json={"reason": "b"}, headers={"Idempotency-Key": "k-1"}),
                       422, "IDEMPOTENCY_KEY_REUSED")
        assert_problem(await c.post(f"/jobs/{other}:cancel", json={"reason": "a"}, headers={"Idempotency-Key": "k-1"}),
                       422, "IDEMPOTENCY_KEY_REUSED")
    billing_job = job(api.dsn, "billing-eu")
    async with api.client("billing") as c:  # another token's keys are its own
        r = await c.post(f"/jobs/{billing_job}:cancel", json={"reason": "a"}, headers={"Idempotency-Key": "k-1"})
        assert r.status_code == 200 and "idempotent-replayed" not in r.headers
    assert row(api.dsn, other)["status"] == "pending" and audit_rows(api.dsn, other) == []


async def test_a_refused_request_stores_no_receipt_so_its_key_can_be_sent_again(api: Api) -> None:
    jid = job(api.dsn, "default")
    async with api.client("billing") as c:
        assert_problem(await c.post(f"/jobs/{jid}:cancel", headers={"Idempotency-Key": "again"}),
                       404, "NOT_FOUND")
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_requests")[0][0] == 0


# -- revision ------------------------------------------------------------------------------------------

async def test_a_stale_expected_revision_answers_409_with_the_current_row(api: Api) -> None:
    jid = job(api.dsn)
    async with api.client() as c:
        seen = (await c.get(f"/jobs/{jid}")).json()["job"]["revision"]
        query(api.dsn, "UPDATE taskq.jobs SET revision = revision + 1, priority = 5 WHERE id = %s", jid)
        body = assert_problem(await c.post(f"/jobs/{jid}:cancel", json={"expected_revision": seen}),
                              409, "STATE_CONFLICT")
        assert body["job"]["revision"] == seen + 1 and body["job"]["status"] == "pending"
        assert_problem(await c.post(f"/jobs/{jid}:cancel", headers={"If-Match": f'"{seen}"'}), 409, "STATE_CONFLICT")
        assert_problem(await c.post(f"/jobs/{jid}:cancel", json={"expected_revision": seen + 1},
                                    headers={"If-Match": f'"{seen}"'}), 400, "INVALID_ARGUMENT")
        assert row(api.dsn, jid)["status"] == "pending"
        ok = await c.post(f"/jobs/{jid}:cancel", json={"expected_revision": seen + 1})
    assert ok.status_code == 200 and ok.json()["job"]["revision"] == seen + 2
    # the second refused write within a minute counts on the first one's row (repeats)
    assert [a[2] for a in audit_rows(api.dsn, jid)] == ["conflict", "cancelled"]
    assert query(api.dsn, "SELECT repeats FROM taskq.operator_audit WHERE job_id = %s ORDER BY id", jid) == [(1,), (0,)]


# -- audit ---------------------------------------------------------------------------------------------

async def test_the_audit_row_and_the_timeline_event_commit_in_the_transaction_of_the_change(api: Api) -> None:
    jid = job(api.dsn, status="running")
    async with api.client() as c:
        r = await c.post(f"/jobs/{jid}:cancel", json={"reason": "audit me"}, headers={"X-Request-Id": "req-42"})
    assert r.status_code == 202 and r.headers["x-request-id"] == "req-42"
    assert audit_rows(api.dsn, jid) == [("admin", "jobs:cancel", "cancel_requested", "audit me", "req-42")]
    # one transaction wrote the job row, its event and the audit row: they carry the same xmin
    (xids,) = query(api.dsn, "SELECT (SELECT xmin::text FROM taskq.jobs WHERE id = %s),"
                             " (SELECT xmin::text FROM taskq.operator_audit WHERE job_id = %s),"
                             " (SELECT xmin::text FROM taskq.job_events WHERE job_id = %s AND kind = 'operator')",
                    jid, jid, jid)
    assert len(set(xids)) == 1, xids
    (event,) = query(api.dsn, "SELECT detail FROM taskq.job_events WHERE job_id = %s AND kind = 'operator'", jid)
    assert event[0]["principal"] == "admin" and event[0]["request_id"] == "req-42"


async def test_a_failing_audit_write_rolls_the_change_back(api: Api) -> None:
    jid = job(api.dsn)
    query(api.dsn, "CREATE FUNCTION taskq.refuse() RETURNS trigger LANGUAGE plpgsql AS "
                   "$$ BEGIN RAISE EXCEPTION 'audit refused'; END $$")
    query(api.dsn, "CREATE TRIGGER refuse BEFORE INSERT ON taskq.operator_audit"
                   " FOR EACH ROW EXECUTE FUNCTION taskq.refuse()")
    async with api.client() as c:
        assert_problem(await c.post(f"/jobs/{jid}:cancel", headers={"Idempotency-Key": "k"}), 500, "INTERNAL")
    after = row(api.dsn, jid)
    assert after["status"] == "pending" and after["revision"] == 1 and after["cancel_requested_at"] is None
    assert query(api.dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s", jid)[0][0] == 0
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_requests")[0][0] == 0


# -- reads ---------------------------------------------------------------------------------------------

async def test_keyset_pages_stay_stable_while_jobs_are_inserted(api: Api) -> None:
    before = {job(api.dsn) for _ in range(23)}
    seen: list[str] = []
    async with api.client() as c:
        cursor = None
        while True:
            params = {"limit": "5"} | ({"cursor": cursor} if cursor else {})
            page = (await c.get("/jobs", params=params)).json()
            seen += [j["id"] for j in page["jobs"]]
            for _ in range(3):  # newer jobs arrive between pages: they sort before the cursor
                job(api.dsn)
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert len(seen) == len(set(seen)) == 23
    assert {UUID(s) for s in seen} == before


async def test_job_detail_has_revision_events_attempts_children_and_audit(api: Api) -> None:
    parent = job(api.dsn)
    (child,) = query(api.dsn, "INSERT INTO taskq.jobs (actor, payload, parent_id) VALUES ('c', '1', %s) RETURNING id",
                     parent)
    async with api.client() as c:
        await c.post(f"/jobs/{parent}:cancel")
        d = (await c.get(f"/jobs/{parent}")).json()
    assert d["job"]["revision"] == 2 and d["job"]["status"] == "cancelled"
    assert [e["kind"] for e in d["events"]] == ["state_change", "operator"]
    assert d["attempts"] == [] and d["parents"] == []
    assert [(c_["id"], c_["spawned"]) for c_ in d["children"]] == [(str(child[0]), True)]
    assert [a["outcome"] for a in d["audit"]] == ["cancelled"]


async def test_job_detail_shows_the_parents_and_children_of_the_dependency_table(api: Api) -> None:
    first, second = job(api.dsn), job(api.dsn, status="succeeded")
    hidden = job(api.dsn, "billing-eu")
    (waiting,) = query(api.dsn, "INSERT INTO taskq.jobs (actor, payload, status, parents_remaining, dependency_mode)"
                                " VALUES ('web.join', '{}', 'awaiting_parents', 1, 'on_success') RETURNING id")
    child = UUID(str(waiting[0]))
    query(api.dsn, "INSERT INTO taskq.job_dependencies (parent_id, child_id, resolved_at, parent_status) VALUES"
                   " (%s, %s, NULL, NULL), (%s, %s, now(), 'succeeded'), (%s, %s, NULL, NULL)",
          first, child, second, child, hidden, child)
    async with api.client() as c:
        d = (await c.get(f"/jobs/{child}")).json()
        up = (await c.get(f"/jobs/{first}")).json()
        depth = (await c.get("/stats")).json()["queues"]["default"]["depth"]
    assert sorted((p["id"], p["status"], p["parent_status"]) for p in d["parents"]) == sorted([
        (str(first), "pending", None), (str(second), "succeeded", "succeeded"), (str(hidden), "pending", None)])
    assert d["children"] == []
    assert [(c_["id"], c_["status"], c_["actor"]) for c_ in up["children"]] == [
        (str(child), "awaiting_parents", "web.join")]
    assert depth["awaiting_parents"] == 1
    async with api.client("billing-ops") as c:  # reads every queue: sees all three parents
        assert len((await c.get(f"/jobs/{child}")).json()["parents"]) == 3
    async with api.client("billing") as c:  # may not read the child's queue
        assert_problem(await c.get(f"/jobs/{child}"), 404, "NOT_FOUND")
        assert [c_["id"] for c_ in (await c.get(f"/jobs/{hidden}")).json()["children"]] == []


async def test_openapi_describes_every_route(api: Api) -> None:
    async with httpx.AsyncClient(base_url=api.url) as c:
        spec = (await c.get("/api/v1/openapi.json")).json()
    assert spec["openapi"].startswith("3.1")
    for path in ("/jobs", "/jobs/{job_id}", "/jobs/{job_id}:cancel", "/jobs/{job_id}:requeue", "/jobs:cancel",
                 "/jobs:requeue", "/workers", "/schedules", "/queues", "/stats", "/cancellations",
                 "/schedules/{name}:pause", "/schedules/{name}:resume", "/schedules/{name}:trigger",
                 "/queues/{name}:pause", "/queues/{name}:resume", "/queues/{name}:limit"):
        assert path in spec["paths"], path
    assert "revision" in spec["components"]["schemas"]["JobRow"]["properties"]


# -- writes --------------------------------------------------------------------------------------------

async def test_enqueue_requeue_and_bulk_cancel(api: Api) -> None:
    async with api.client() as c:
        made = await c.post("/jobs", json={"actor": "web.made", "payload": {"n": 1}, "queue": "q1", "tags": ["t"]},
                            headers={"Idempotency-Key": "enq-1"})
        replay = await c.post("/jobs", json={"actor": "web.made", "payload": {"n": 1}, "queue": "q1", "tags": ["t"]},
                              headers={"Idempotency-Key": "enq-1"})
        assert made.status_code == 201 and replay.status_code == 201 and replay.json() == made.json()
        assert query(api.dsn, "SELECT count(*) FROM taskq.jobs WHERE actor = 'web.made'")[0][0] == 1
        failed = job(api.dsn, "q1", status="failed")
        r = await c.post(f"/jobs/{failed}:requeue", json={"reason": "fixed", "attempts": 2})
        assert r.status_code == 200 and r.json()["job"]["status"] == "pending"
        assert r.json()["job"]["max_attempts"] == 2
        assert_problem(await c.post(f"/jobs/{failed}:requeue"), 409, "STATE_CONFLICT")
        for _ in range(4):
            job(api.dsn, "bulkq")
        job(api.dsn, "bulkq", status="running")
        bulk = await c.post("/jobs:cancel", json={"filter": {"queue": "bulkq"}, "limit": 3, "reason": "drain"})
        assert bulk.status_code == 200, bulk.text
        b = bulk.json()
        assert b["matched"] == 3 and len(b["job_ids"]) == 3 and b["more"] is True
        rest = (await c.post("/jobs:cancel", json={"filter": {"queue": "bulkq"}, "limit": 10})).json()
        assert rest["matched"] == 2 and rest["more"] is False
        assert sum(b["by_previous_status"].values()) + sum(rest["by_previous_status"].values()) == 5
        assert_problem(await c.post("/jobs:cancel", json={"filter": {}}), 400, "INVALID_ARGUMENT")
        assert_problem(await c.post("/jobs:cancel", json={"filter": {"queue": "x"}, "limit": 5000}),
                       400, "INVALID_ARGUMENT")
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_audit WHERE action = 'jobs:cancel'")[0][0] == 5
    assert query(api.dsn, "SELECT count(*) FROM taskq.jobs WHERE queue = 'bulkq' AND cancel_requested_at IS NULL"
                 )[0][0] == 0


async def test_schedules_pause_resume_and_trigger(api: Api) -> None:
    query(api.dsn, "INSERT INTO taskq.schedules (name, actor, queue, every_seconds, definition, next_run_at, owner)"
                   " VALUES ('nightly', 'web.tick', 'default', 3600, 'every 3600s', now() + interval '1 hour', 't')")
    async with api.client() as c:
        paused = await c.post("/schedules/nightly:pause")
        assert paused.status_code == 200 and paused.json()["paused"] is True
        listed = (await c.get("/schedules")).json()["schedules"]
        assert listed[0]["paused"] is True and listed[0]["paused_by"] == "admin"
        trig = await c.post("/schedules/nightly:trigger")
        assert trig.status_code == 200 and UUID(trig.json()["job_id"])
        assert (await c.post("/schedules/nightly:resume")).json()["paused"] is False
        assert_problem(await c.post("/schedules/nope:pause"), 404, "NOT_FOUND")
    assert [r[0] for r in query(api.dsn, "SELECT action FROM taskq.operator_audit ORDER BY id")] == [
        "schedules:pause", "schedules:trigger", "schedules:resume"]


def queue_state(dsn: str, name: str) -> tuple[Any, ...] | None:
    found = query(dsn, "SELECT paused_at IS NOT NULL, paused_by, pause_reason FROM taskq.queues WHERE name = %s",
                  name)
    return tuple(found[0]) if found else None


async def test_queues_pause_and_resume_are_audited_with_the_queue_event(api: Api) -> None:
    job(api.dsn, "billing-eu")
    async with api.client("billing-ops") as c:
        paused = await c.post("/queues/billing-eu:pause", json={"reason": "maintenance"},
                              headers={"Idempotency-Key": "qp-1", "X-Request-Id": "req-qp-1"})
        assert paused.status_code == 200, paused.text
        assert paused.json() == {"name": "billing-eu", "paused": True, "changed": True}
        replay = await c.post("/queues/billing-eu:pause", json={"reason": "maintenance"},
                              headers={"Idempotency-Key": "qp-1"})
        assert replay.status_code == 200 and replay.json() == paused.json()
        assert replay.headers["idempotent-replayed"] == "true"
        listed = {q["name"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["billing-eu"]["paused"] is True
        assert listed["billing-eu"]["limits"] == {"concurrency": None, "concurrency_per_key": None,
                                                  "rate_limit": None, "rate_period": None}
        stats = (await c.get("/stats")).json()["queues"]["billing-eu"]
        assert stats["paused"] is True and stats["pause"]["by"] == "billing-ops"
        assert stats["pause"]["reason"] == "maintenance"
        again = await c.post("/queues/billing-eu:pause")
        assert again.status_code == 200 and again.json()["changed"] is False
        assert queue_state(api.dsn, "billing-eu") == (True, "billing-ops", "maintenance")
        resumed = await c.post("/queues/billing-eu:resume")
        assert resumed.json() == {"name": "billing-eu", "paused": False, "changed": True}
    assert queue_state(api.dsn, "billing-eu") == (False, None, None)
    assert query(api.dsn, "SELECT principal, action, outcome, queue, reason, job_id FROM taskq.operator_audit"
                          " ORDER BY id") == [
        ("billing-ops", "queues:pause", "paused", "billing-eu", "maintenance", None),
        ("billing-ops", "queues:pause", "unchanged", "billing-eu", None, None),
        ("billing-ops", "queues:resume", "resumed", "billing-eu", None, None)]
    assert query(api.dsn, "SELECT request_id FROM taskq.operator_audit ORDER BY id LIMIT 1") == [("req-qp-1",)]
    assert query(api.dsn, "SELECT kind, done_by, reason FROM taskq.queue_events WHERE queue = 'billing-eu'"
                          " ORDER BY id") == [("paused", "billing-ops", "maintenance"),
                                              ("resumed", "billing-ops", None)]


async def test_a_queue_action_on_an_unknown_queue_or_without_the_grant_changes_nothing(api: Api) -> None:
    job(api.dsn, "default")
    async with api.client() as c:
        assert_problem(await c.post("/queues/no-such-queue:pause", headers={"Idempotency-Key": "qp-2"}),
                       404, "NOT_FOUND")
    async with api.client("billing-ops") as c:
        assert_problem(await c.post("/queues/default:pause"), 403, "PERMISSION_DENIED")
    async with api.client("reader") as c:
        assert_problem(await c.post("/queues/default:resume"), 403, "PERMISSION_DENIED")
    assert queue_state(api.dsn, "no-such-queue") is None and queue_state(api.dsn, "default") is None
    for table in ("queue_events", "operator_audit", "operator_requests"):
        assert query(api.dsn, f"SELECT count(*) FROM taskq.{table}")[0][0] == 0, table


def queue_limits(dsn: str, name: str) -> tuple[Any, ...] | None:
    found = query(dsn, "SELECT concurrency_limit, concurrency_per_key, rate_limit, rate_period FROM taskq.queues"
                       " WHERE name = %s", name)
    return tuple(found[0]) if found else None


async def test_queue_limits_are_set_kept_and_removed_through_the_queue_service_and_audited(api: Api) -> None:
    job(api.dsn, "billing-eu")
    async with api.client("billing-ops") as c:
        first = await c.post("/queues/billing-eu:limit", json={"concurrency": 4, "rate_limit": 50, "rate_period": 1,
                                                               "reason": "provider quota"},
                             headers={"Idempotency-Key": "ql-1", "X-Request-Id": "req-ql-1"})
        assert first.status_code == 200, first.text
        assert first.json() == {"name": "billing-eu", "limits": {"concurrency": 4, "concurrency_per_key": None,
                                                                 "rate_limit": 50, "rate_period": 1.0}}
        replay = await c.post("/queues/billing-eu:limit", json={"concurrency": 4, "rate_limit": 50, "rate_period": 1,
                                                                "reason": "provider quota"},
                              headers={"Idempotency-Key": "ql-1"})
        assert replay.status_code == 200 and replay.json() == first.json()
        assert replay.headers["idempotent-replayed"] == "true"
        reused = await c.post("/queues/billing-eu:limit", json={"concurrency": 5}, headers={"Idempotency-Key": "ql-1"})
        assert_problem(reused, 422, "IDEMPOTENCY_KEY_REUSED")
        assert queue_limits(api.dsn, "billing-eu") == (4, None, 50, 1.0)
        per_key = await c.post("/queues/billing-eu:limit", json={"concurrency_per_key": 2})  # the rest is kept
        assert per_key.json()["limits"] == {"concurrency": 4, "concurrency_per_key": 2, "rate_limit": 50,
                                            "rate_period": 1.0}
        listed = {q["name"]: q for q in (await c.get("/queues")).json()["queues"]}
        assert listed["billing-eu"]["limits"] == per_key.json()["limits"]
        removed = await c.post("/queues/billing-eu:limit", json={"concurrency": None, "rate_limit": None})
        assert removed.json()["limits"] == {"concurrency": None, "concurrency_per_key": 2, "rate_limit": None,
                                            "rate_period": None}
        assert_problem(await c.post("/queues/default:limit", json={"concurrency": 1}), 403, "PERMISSION_DENIED")
    async with api.client("reader") as c:
        assert_problem(await c.post("/queues/billing-eu:limit", json={"concurrency": 1}), 403, "PERMISSION_DENIED")
    assert queue_limits(api.dsn, "billing-eu") == (None, 2, None, None) and queue_limits(api.dsn, "default") is None
    audits = query(api.dsn, "SELECT principal, action, outcome, queue, reason, request_id, detail"
                            " FROM taskq.operator_audit ORDER BY id")
    assert [a[:6] for a in audits] == [
        ("billing-ops", "queues:limit", "limited", "billing-eu", "provider quota", "req-ql-1"),
        ("billing-ops", "queues:limit", "limited", "billing-eu", None, audits[1][5]),
        ("billing-ops", "queues:limit", "limited", "billing-eu", None, audits[2][5])]
    assert audits[0][6] == {"change": {"concurrency": 4, "rate_limit": 50, "rate_period": 1}}
    assert audits[2][6] == {"change": {"concurrency": None, "rate_limit": None}}
    events = query(api.dsn, "SELECT kind, done_by, reason, detail FROM taskq.queue_events WHERE queue = 'billing-eu'"
                            " ORDER BY id")
    assert [e[:3] for e in events] == [("limits", "billing-ops", "provider quota"), ("limits", "billing-ops", None),
                                       ("limits", "billing-ops", None)]
    assert events[0][3] == {"concurrency": 4, "concurrency_per_key": None, "rate_limit": 50, "rate_period": 1.0}


# -- bad input -----------------------------------------------------------------------------------------

BAD_REQUESTS: list[tuple[str, str, str, dict[str, Any], int, str]] = [
    ("malformed id", "GET", "/jobs/not-a-uuid", {}, 400, "INVALID_ARGUMENT"),
    ("malformed id on cancel", "POST", "/jobs/123:cancel", {}, 400, "INVALID_ARGUMENT"),
    ("unknown filter", "GET", "/jobs?color=red", {}, 400, "INVALID_ARGUMENT"),
    ("unknown status", "GET", "/jobs?status=done", {}, 400, "INVALID_ARGUMENT"),
    ("naive time", "GET", "/jobs?created_after=2030-01-01T00:00:00", {}, 400, "INVALID_ARGUMENT"),
    ("bad cursor", "GET", "/jobs?cursor=%%%", {}, 400, "INVALID_ARGUMENT"),
    ("limit too big", "GET", "/jobs?limit=100000", {}, 400, "INVALID_ARGUMENT"),
    ("NUL in a filter", "GET", "/jobs?queue=a%00b", {}, 400, "INVALID_ARGUMENT"),
    ("not JSON", "POST", "/jobs/{id}:cancel", {"content": b"{nope"}, 400, "INVALID_ARGUMENT"),
    ("NaN", "POST", "/jobs/{id}:cancel", {"content": b'{"expected_revision": NaN}'}, 400, "INVALID_ARGUMENT"),
    ("not an object", "POST", "/jobs/{id}:cancel", {"content": b"[1]"}, 400, "INVALID_ARGUMENT"),
    ("unknown field", "POST", "/jobs/{id}:cancel", {"json": {"force": True}}, 400, "INVALID_ARGUMENT"),
    ("revision not a number", "POST", "/jobs/{id}:cancel", {"json": {"expected_revision": "x"}}, 400,
     "INVALID_ARGUMENT"),
    ("bad If-Match", "POST", "/jobs/{id}:cancel", {"headers": {"If-Match": "soon"}}, 400, "INVALID_ARGUMENT"),
    ("bad key", "POST", "/jobs/{id}:cancel", {"headers": {"Idempotency-Key": "x" * 300}}, 400, "INVALID_ARGUMENT"),
    ("oversized body", "POST", "/jobs/{id}:cancel", {"content": b'{"reason": "' + b"x" * 2_000_000 + b'"}'}, 413,
     "TOO_LARGE"),
    ("unknown job", "POST", f"/jobs/{uuid4()}:cancel", {}, 404, "NOT_FOUND"),
    ("unknown route", "GET", "/nothing-here", {}, 404, "NOT_FOUND"),
    ("enqueue without actor", "POST", "/jobs", {"json": {"payload": 1}}, 400, "INVALID_ARGUMENT"),
    ("enqueue bad priority", "POST", "/jobs", {"json": {"actor": "a", "priority": 2**40}}, 400, "INVALID_ARGUMENT"),
    ("enqueue NUL queue", "POST", "/jobs", {"json": {"actor": "a", "queue": "a\u0000"}}, 400, "INVALID_ARGUMENT"),
    ("bulk unknown filter", "POST", "/jobs:cancel", {"json": {"filter": {"colour": "red"}}}, 400,
     "INVALID_ARGUMENT"),
    ("schedule action with a body", "POST", "/schedules/x:pause", {"json": {"now": True}}, 400, "INVALID_ARGUMENT"),
    ("queue pause unknown field", "POST", "/queues/default:pause", {"json": {"now": True}}, 400, "INVALID_ARGUMENT"),
    ("queue pause reason too long", "POST", "/queues/default:pause", {"json": {"reason": "x" * 10_001}}, 400,
     "INVALID_ARGUMENT"),
    ("queue pause NUL reason", "POST", "/queues/default:pause", {"json": {"reason": "a\u0000"}}, 400,
     "INVALID_ARGUMENT"),
    ("queue pause reason not text", "POST", "/queues/default:resume", {"json": {"reason": 5}}, 400,
     "INVALID_ARGUMENT"),
    ("queue NUL name", "POST", "/queues/a%00b:pause", {}, 400, "INVALID_ARGUMENT"),
    ("limit with nothing to set", "POST", "/queues/default:limit", {"headers": {"Idempotency-Key": "l-0"}}, 400,
     "INVALID_ARGUMENT"),
    ("limit of zero", "POST", "/queues/default:limit", {"json": {"concurrency": 0}}, 400, "INVALID_ARGUMENT"),
    ("limit negative per key", "POST", "/queues/default:limit", {"json": {"concurrency_per_key": -2}}, 400,
     "INVALID_ARGUMENT"),
    ("limit not whole", "POST", "/queues/default:limit", {"json": {"concurrency": 2.5},
                                                            "headers": {"Idempotency-Key": "l-1"}}, 400,
     "INVALID_ARGUMENT"),
    ("limit as text", "POST", "/queues/default:limit", {"json": {"concurrency": "3"}}, 400, "INVALID_ARGUMENT"),
    ("limit as bool", "POST", "/queues/default:limit", {"json": {"concurrency": True}}, 400, "INVALID_ARGUMENT"),
    ("limit too big", "POST", "/queues/default:limit", {"json": {"concurrency": 2**31}}, 400, "INVALID_ARGUMENT"),
    ("rate without period", "POST", "/queues/default:limit", {"json": {"rate_limit": 5},
                                                                "headers": {"Idempotency-Key": "l-2"}}, 400,
     "INVALID_ARGUMENT"),
    ("period without rate", "POST", "/queues/default:limit", {"json": {"rate_period": 1.0}}, 400,
     "INVALID_ARGUMENT"),
    ("negative period", "POST", "/queues/default:limit", {"json": {"rate_limit": 5, "rate_period": -1}}, 400,
     "INVALID_ARGUMENT"),
    ("NaN period", "POST", "/queues/default:limit", {"content": b'{"rate_limit": 5, "rate_period": NaN}'}, 400,
     "INVALID_ARGUMENT"),
    ("period over a year", "POST", "/queues/default:limit", {"json": {"rate_limit": 5, "rate_period": 4e7}}, 400,
     "INVALID_ARGUMENT"),
    ("limit unknown field", "POST", "/queues/default:limit", {"json": {"concurrency": 2, "burst": 3}}, 400,
     "INVALID_ARGUMENT"),
    ("limit NUL reason", "POST", "/queues/default:limit", {"json": {"concurrency": 2, "reason": "a\u0000"}}, 400,
     "INVALID_ARGUMENT"),
]


@pytest.mark.parametrize(("what", "method", "path", "extra", "status", "code"), BAD_REQUESTS,
                         ids=[b[0] for b in BAD_REQUESTS])
async def test_bad_input_gets_the_error_shape_and_changes_nothing(
    api: Api, what: str, method: str, path: str, extra: dict[str, Any], status: int, code: str
) -> None:
    jid = job(api.dsn)
    before = row(api.dsn, jid)
    jobs_before = query(api.dsn, "SELECT count(*) FROM taskq.jobs")[0][0]
    if "content" in extra:  # raw bytes: say they are JSON, as a client must (else 415, test_web_guard.py)
        extra = {**extra, "headers": {"Content-Type": "application/json", **extra.get("headers", {})}}
    async with api.client() as c:
        r = await c.request(method, path.replace("{id}", str(jid)), **extra)
    assert_problem(r, status, code)
    assert row(api.dsn, jid) == before
    assert query(api.dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == jobs_before
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_audit")[0][0] == 0
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_requests")[0][0] == 0
    assert query(api.dsn, "SELECT count(*) FROM taskq.queues")[0][0] == 0
    assert query(api.dsn, "SELECT count(*) FROM taskq.queue_events")[0][0] == 0


# -- serving -------------------------------------------------------------------------------------------

def test_serving_without_auth_off_loopback_is_refused(dsn: str) -> None:
    done = subprocess.run([sys.executable, "-m", "taskq.cli", "--dsn", dsn, "web", "--host", "0.0.0.0", "--no-auth"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "refusing to serve without auth" in done.stderr


def test_tokens_cli_prints_the_token_once_and_stores_only_its_hash(dsn: str) -> None:
    def taskq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "taskq.cli", "--dsn", dsn, *args], capture_output=True,
                              text=True, timeout=60, check=False)

    made = taskq("tokens", "create", "ops", "--grant", "jobs:read@*", "--grant", "jobs:cancel@billing-*")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("tq_") and len(token) > 40
    assert query(dsn, "SELECT count(*) FROM taskq.api_tokens WHERE token_hash = %s", token)[0][0] == 0
    listed = taskq("tokens", "list", "--json")
    assert token not in listed.stdout and json.loads(listed.stdout)[0]["grants"] == [
        "jobs:read@*", "jobs:cancel@billing-*"]
    assert taskq("tokens", "create", "ops", "--grant", "jobs:read@*").returncode == 7
    assert taskq("tokens", "create", "x", "--grant", "jobs:destroy@*").returncode == 2
    assert taskq("tokens", "create", "bad name", "--grant", "jobs:read@*").returncode == 2
    assert taskq("tokens", "revoke", "nobody").returncode == 4
    assert taskq("tokens", "revoke", "ops").returncode == 0
    assert taskq("tokens", "revoke", "ops").stdout.strip() == "ops: already revoked"
    wait_until(lambda: query(dsn, "SELECT revoked_at IS NOT NULL FROM taskq.api_tokens")[0][0])

