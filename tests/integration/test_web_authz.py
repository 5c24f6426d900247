"""What a token may see and change through /api/v1, against a real `taskq web` process and a real
database: the review's reproductions of cross-queue reads through unique keys (H2), write grants that
read (M1), scoped bulk actions (L2), bulk conflicts (L3), grant-model gaps (L5), the If-Match
fingerprint (I1) and the bounded job detail (M4), with the review's tokens."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from test_web_api import Api, assert_problem, job, row, server  # noqa: F401 - `server` is a fixture
from testkit import WebServer, query, wait_for

from taskq.backend import Backend
from taskq.ops.tokens import create_token
from taskq.web import create_app

GRANTS = {
    "admin": ["*@*"],
    "sandbox": ["jobs:*@sandbox", "queues:read@sandbox"],
    "reader": ["jobs:read@sandbox"],
    "billingcancel": ["jobs:cancel@billing", "jobs:read@billing"],
    "cancelonly": ["jobs:cancel@billing"],
    "requeueonly": ["jobs:requeue@billing"],
    "qread": ["queues:read@*"],
    "qwrite": ["queues:write@*"],
    "wild": ["jobs:read@*zzz"],
    "sandboxops": ["jobs:read@sandbox", "workers:read@sandbox"],
}
CARD = {"card": "4111111111111111", "cvv": "123", "amount": 990}


@pytest.fixture
async def api(dsn: str, server: WebServer) -> AsyncIterator[Api]:  # noqa: F811 - the imported fixture
    backend = await Backend.open(dsn)
    try:
        tokens = {name: (await create_token(backend, name, grants))[1] for name, grants in GRANTS.items()}
    finally:
        await backend.close()
    yield Api(server.url, tokens, dsn)


def billing_job(dsn: str, status: str = "pending") -> UUID:
    jid = job(dsn, "billing", status=status)
    query(dsn, "UPDATE taskq.jobs SET payload = %s::jsonb WHERE id = %s", json.dumps(CARD), jid)
    return jid


def operator_events(dsn: str, jid: UUID) -> int:
    return int(query(dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s AND kind = 'operator'", jid)[0][0])


# -- H2: unique keys are one namespace; the holder is shown only to those who may read it --------------

async def test_a_key_held_in_an_unreadable_queue_answers_409_without_the_holder(api: Api) -> None:
    async with api.client("admin") as c:
        made = await c.post("/jobs", json={"actor": "billing.charge", "queue": "billing", "unique_key": "invoice-42",
                                           "payload": CARD})
    assert made.status_code == 201, made.text
    holder = made.json()["job"]["id"]
    events_before = operator_events(api.dsn, UUID(holder))
    async with api.client("sandbox") as c:
        r = await c.post("/jobs", json={"actor": "x", "queue": "sandbox", "unique_key": "invoice-42"},
                         headers={"X-Request-Id": "req-h2"})
    body = assert_problem(r, 409, "UNIQUE_KEY_HELD")
    assert "job" not in body
    for secret in (holder, "billing", "4111111111111111", "cvv"):
        assert secret not in r.text, secret
    assert operator_events(api.dsn, UUID(holder)) == events_before
    assert query(api.dsn, "SELECT principal, action, outcome, queue, job_id FROM taskq.operator_audit"
                          " WHERE request_id = 'req-h2'") == [("sandbox", "jobs:enqueue", "unique_key_held",
                                                               "sandbox", None)]
    assert query(api.dsn, "SELECT count(*) FROM taskq.jobs WHERE unique_key = 'invoice-42'")[0][0] == 1


async def test_a_key_held_in_a_readable_queue_still_answers_200_with_the_holder(api: Api) -> None:
    async with api.client("sandbox") as c:
        first = await c.post("/jobs", json={"actor": "x", "queue": "sandbox", "unique_key": "k-1"})
        again = await c.post("/jobs", json={"actor": "x", "queue": "sandbox", "unique_key": "k-1"})
    assert first.status_code == 201 and again.status_code == 200, again.text
    assert again.json()["created"] is False and again.json()["job"]["id"] == first.json()["job"]["id"]


# -- M1: a write grant does not read ------------------------------------------------------------------

async def test_cancel_without_read_answers_only_id_status_and_revision(api: Api) -> None:
    jid = billing_job(api.dsn)
    minimal = {"id", "status", "revision"}
    async with api.client("cancelonly") as c:
        stale = await c.post(f"/jobs/{jid}:cancel", json={"expected_revision": 999})
        body = assert_problem(stale, 409, "STATE_CONFLICT")
        assert set(body["job"]) == minimal and body["job"]["status"] == "pending"
        assert "4111" not in stale.text
        done = await c.post(f"/jobs/{jid}:cancel")
        assert done.status_code == 200 and set(done.json()["job"]) == minimal
        assert done.json()["job"]["status"] == "cancelled"
        again = await c.post(f"/jobs/{jid}:cancel")
        assert set(assert_problem(again, 409, "STATE_CONFLICT")["job"]) == minimal
    running = billing_job(api.dsn, status="running")
    async with api.client("cancelonly") as c:
        r = await c.post(f"/jobs/{running}:cancel")
    assert r.status_code == 202 and set(r.json()["job"]) == minimal
    other = billing_job(api.dsn)
    async with api.client("billingcancel") as c:  # with jobs:read: the full row
        full = await c.post(f"/jobs/{other}:cancel", json={"expected_revision": 999})
    assert assert_problem(full, 409, "STATE_CONFLICT")["job"]["payload"] == CARD


async def test_requeue_without_read_answers_only_id_status_and_revision(api: Api) -> None:
    failed, pending = billing_job(api.dsn, status="failed"), billing_job(api.dsn)
    async with api.client("requeueonly") as c:
        stale = await c.post(f"/jobs/{failed}:requeue", json={"expected_revision": 999})
        assert set(assert_problem(stale, 409, "STATE_CONFLICT")["job"]) == {"id", "status", "revision"}
        ok = await c.post(f"/jobs/{failed}:requeue")
        assert ok.status_code == 200 and set(ok.json()["job"]) == {"id", "status", "revision"}
        refused = await c.post(f"/jobs/{pending}:requeue")
        assert set(assert_problem(refused, 409, "STATE_CONFLICT")["job"]) == {"id", "status", "revision"}
    assert "4111" not in stale.text + ok.text + refused.text


# -- L2: scoped bulk actions select their own jobs in SQL ---------------------------------------------

async def test_a_scoped_bulk_cancel_reaches_its_own_jobs_and_more_counts_only_them(api: Api) -> None:
    mine = {billing_job(api.dsn) for _ in range(5)}
    others = {job(api.dsn, "other") for _ in range(12)}  # newer than mine
    async with api.client("billingcancel") as c:
        first = await c.post("/jobs:cancel", json={"filter": {"status": "pending"}, "limit": 2})
        assert first.status_code == 200, first.text
        assert first.json()["matched"] == 2 and first.json()["more"] is True
        rest = (await c.post("/jobs:cancel", json={"filter": {"status": "pending"}, "limit": 10})).json()
        assert rest["matched"] == 3 and rest["more"] is False
        after = (await c.post("/jobs:cancel", json={"filter": {"status": "pending"}, "limit": 10})).json()
        assert after["matched"] == 0 and after["more"] is False  # 12 pending in 'other' do not show
    assert {row(api.dsn, j)["status"] for j in mine} == {"cancelled"}
    assert {row(api.dsn, j)["status"] for j in others} == {"pending"}
    async with api.client("reader") as c:  # no jobs:cancel anywhere
        assert_problem(await c.post("/jobs:cancel", json={"filter": {"status": "pending"}}), 403,
                       "PERMISSION_DENIED")
        assert_problem(await c.post("/jobs:requeue", json={"filter": {"status": "failed"}}), 403,
                       "PERMISSION_DENIED")
    async with api.client("cancelonly") as c:  # may cancel but not read: selects nothing
        r = (await c.post("/jobs:cancel", json={"filter": {"status": "pending"}})).json()
    assert r["matched"] == 0 and r["more"] is False


# -- L3: bulk conflicts -------------------------------------------------------------------------------

def keyed(dsn: str, queue: str, status: str, key: str) -> UUID:
    jid = job(dsn, queue, status=status)
    query(dsn, "UPDATE taskq.jobs SET unique_key = %s, unique_scope = 'active' WHERE id = %s", key, jid)
    return jid


async def test_a_bulk_requeue_whose_targets_all_conflict_answers_409_and_audits_each(api: Api) -> None:
    failed = keyed(api.dsn, "uq", "failed", "u1")
    holder = keyed(api.dsn, "uq", "pending", "u1")
    async with api.client("admin") as c:
        r = await c.post("/jobs:requeue", json={"filter": {"queue": "uq", "status": "failed"}},
                         headers={"X-Request-Id": "req-l3"})
    body = assert_problem(r, 409, "STATE_CONFLICT")
    assert body["conflicts"] == {str(failed): str(holder)} and body["job_ids"] == []
    assert query(api.dsn, "SELECT job_id, outcome FROM taskq.operator_audit WHERE request_id = 'req-l3'") == [
        (failed, "conflict")]
    assert row(api.dsn, failed)["status"] == "failed"


async def test_requeue_conflicts_name_the_holder_only_when_it_is_readable(api: Api) -> None:
    failed = keyed(api.dsn, "sandbox", "failed", "shared")
    holder = keyed(api.dsn, "billing", "pending", "shared")
    async with api.client("sandbox") as c:
        one = await c.post(f"/jobs/{failed}:requeue")
        bulk = await c.post("/jobs:requeue", json={"filter": {"status": "failed"}})
    assert "conflict_job_id" not in assert_problem(one, 409, "STATE_CONFLICT")
    assert assert_problem(bulk, 409, "STATE_CONFLICT")["conflicts"] == {str(failed): None}
    assert str(holder) not in one.text + bulk.text
    async with api.client("admin") as c:
        assert assert_problem(await c.post(f"/jobs/{failed}:requeue"), 409,
                              "STATE_CONFLICT")["conflict_job_id"] == str(holder)


async def test_a_bulk_cancel_whose_targets_all_changed_meanwhile_does_not_fail(api: Api) -> None:
    jid = job(api.dsn, "race")
    async with await psycopg.AsyncConnection.connect(api.dsn) as locker:
        await locker.execute("SELECT 1 FROM taskq.jobs WHERE id = %s FOR UPDATE", (jid,))
        async with api.client("admin") as c:
            sent = asyncio.create_task(c.post("/jobs:cancel", json={"filter": {"queue": "race"}},
                                              headers={"X-Request-Id": "req-race"}))

            async def blocked() -> bool:
                found = query(api.dsn, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                                       " AND datname = current_database()")
                return bool(found[0][0])

            await wait_for(blocked, timeout=20, interval=0.05)
            await locker.execute("UPDATE taskq.jobs SET status = 'succeeded', finished_at = now(),"
                                 " revision = revision + 1 WHERE id = %s", (jid,))
            await locker.commit()
            r = await sent
    assert r.status_code in (200, 409), r.text
    assert r.json()["job_ids"] == []
    assert row(api.dsn, jid)["status"] == "succeeded"
    assert query(api.dsn, "SELECT job_id, outcome FROM taskq.operator_audit WHERE request_id = 'req-race'") == [
        (jid, "conflict")]


# -- L5: grants, 404 against 403, workers, spawned parents ----------------------------------------------

async def test_queues_read_is_the_grant_of_the_queue_list_and_the_queue_fields(api: Api) -> None:
    job(api.dsn, "sandbox")
    async with api.client("admin") as c:
        assert (await c.post("/queues/sandbox:limit", json={"concurrency": 3})).status_code == 200
    async with api.client("qread") as c:
        listed = await c.get("/queues")
    assert listed.status_code == 200, listed.text
    assert {q["name"]: q["limits"]["concurrency"] for q in listed.json()["queues"]} == {"sandbox": 3}
    async with api.client("reader") as c:  # jobs:read only: no queue list, no pause or limits
        assert_problem(await c.get("/queues"), 403, "PERMISSION_DENIED")
        stats = (await c.get("/stats")).json()["queues"]["sandbox"]
    assert stats["depth"] == {"pending": 1} and stats["limits"] is None and stats["paused"] is None
    async with api.client("sandbox") as c:
        assert (await c.get("/stats")).json()["queues"]["sandbox"]["limits"]["concurrency"] == 3


async def test_a_queue_limit_of_an_unknown_queue_answers_404_and_creates_nothing(api: Api) -> None:
    async with api.client("qwrite") as c:
        assert_problem(await c.post("/queues/junk-6056:limit", json={"concurrency": 2}), 404, "NOT_FOUND")
    assert query(api.dsn, "SELECT count(*) FROM taskq.queues")[0][0] == 0
    assert query(api.dsn, "SELECT count(*) FROM taskq.operator_audit WHERE action LIKE 'queues:%%'")[0][0] == 0


async def test_a_job_the_token_can_neither_read_nor_act_on_answers_404(api: Api) -> None:
    jid = billing_job(api.dsn)
    async with api.client("sandbox") as c:
        for r in (await c.get(f"/jobs/{jid}"), await c.post(f"/jobs/{jid}:cancel"),
                  await c.post(f"/jobs/{jid}:requeue"), await c.get(f"/jobs/{jid}/events"),
                  await c.get(f"/jobs/{jid}/audit")):
            assert_problem(r, 404, "NOT_FOUND")
            assert "billing" not in r.text
    async with api.client("cancelonly") as c:  # may act on it, not read it: 403 without the queue
        r = await c.get(f"/jobs/{jid}")
        assert_problem(r, 403, "PERMISSION_DENIED")
        assert "billing" not in r.text
    async with api.client("billingcancel") as c:  # reads it: the 403 may name the queue
        assert_problem(await c.post(f"/jobs/{jid}:requeue"), 403, "PERMISSION_DENIED")
    assert row(api.dsn, jid)["revision"] == 1


async def test_workers_show_only_readable_queues_and_held_jobs(api: Api) -> None:
    query(api.dsn, "INSERT INTO taskq.workers (id, host, pid, queues, concurrency) VALUES ('w1', 'h', 1,"
                   " '{sandbox,billing}', 4)")
    billing_job(api.dsn, status="running")  # held by w1
    async with api.client("sandboxops") as c:
        workers = (await c.get("/workers")).json()["workers"]
    assert [(w["id"], w["queues"], w["held"], w["held_jobs"]) for w in workers] == [("w1", ["sandbox"], 0, [])]
    async with api.client("admin") as c:
        (w,) = (await c.get("/workers")).json()["workers"]
    assert w["queues"] == ["sandbox", "billing"] and w["held"] == 1


async def test_the_detail_hides_a_spawned_parent_of_an_unreadable_queue(api: Api) -> None:
    parent = billing_job(api.dsn)
    (child,) = query(api.dsn, "INSERT INTO taskq.jobs (actor, queue, payload, parent_id) VALUES ('c', 'sandbox',"
                              " '1', %s) RETURNING id", parent)
    async with api.client("sandbox") as c:
        d = await c.get(f"/jobs/{child[0]}")
    assert d.status_code == 200 and d.json()["parents"] == [] and str(parent) not in d.text
    async with api.client("admin") as c:
        assert (await c.get(f"/jobs/{child[0]}")).json()["parents"] == [{"id": str(parent), "spawned": True}]


# -- I1: If-Match is part of the request a key stands for -----------------------------------------------

async def test_the_same_key_with_another_if_match_answers_422(api: Api) -> None:
    jid = job(api.dsn, status="running")
    async with api.client("admin") as c:
        first = await c.post(f"/jobs/{jid}:cancel", headers={"Idempotency-Key": "im-1", "If-Match": '"2"'})
        assert first.status_code == 202, first.text
        replay = await c.post(f"/jobs/{jid}:cancel", headers={"Idempotency-Key": "im-1", "If-Match": '"2"'})
        assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
        other = await c.post(f"/jobs/{jid}:cancel", headers={"Idempotency-Key": "im-1", "If-Match": '"7"'})
        assert_problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
        same = await c.post(f"/jobs/{jid}:cancel", json={"expected_revision": 2}, headers={"Idempotency-Key": "im-1"})
        assert same.status_code == 202 and same.headers["idempotent-replayed"] == "true"


# -- M4: the job detail is bounded; the rest is paged -------------------------------------------------

async def test_the_job_detail_is_bounded_and_events_and_audit_page_through_the_rest(api: Api) -> None:
    jid = job(api.dsn, "sandbox")
    query(api.dsn, "INSERT INTO taskq.job_events (job_id, kind, detail) SELECT %s, 'note',"
                   " jsonb_build_object('n', i) FROM generate_series(1, 130) AS i", jid)
    query(api.dsn, "INSERT INTO taskq.operator_audit (principal, action, outcome, queue, job_id)"
                   " SELECT 'ops', 'jobs:cancel', 'conflict', 'sandbox', %s FROM generate_series(1, 120)", jid)
    async with api.client("sandbox") as c:
        d = (await c.get(f"/jobs/{jid}")).json()
        assert len(d["events"]) == 100 and len(d["audit"]) == 100 and d["attempts"] == []
        assert d["more"] == {"events": True, "attempts": False, "audit": True}
        assert d["events"][-1]["detail"] == {"n": 130}  # the newest, oldest first as before
        for what, total in (("events", 130), ("audit", 120)):
            seen: list[Any] = []
            cursor = None
            while True:
                page = await c.get(f"/jobs/{jid}/{what}", params={"limit": "50"} | ({"cursor": cursor} if cursor
                                                                                    else {}))
                assert page.status_code == 200, page.text
                seen += [e["id"] for e in page.json()[what]]
                cursor = page.json()["next_cursor"]
                if cursor is None:
                    break
            assert len(seen) == len(set(seen)) == total and seen == sorted(seen, reverse=True)
        assert_problem(await c.get(f"/jobs/{jid}/events", params={"cursor": "%%%"}), 400, "INVALID_ARGUMENT")
        assert_problem(await c.get(f"/jobs/{jid}/audit", params={"limit": "0"}), 400, "INVALID_ARGUMENT")
    app = create_app(api.dsn, auth=False)  # the dashboard's job page shows the bounded lists and says so
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            page = await c.get(f"/jobs/{jid}")
    finally:
        await app.state.taskq.close()
    assert page.status_code == 200 and page.text.count('class="event"') == 100
    assert 'id="events-more"' in page.text and 'id="audit-more"' in page.text
    assert 'id="attempts-more"' not in page.text
    async with httpx.AsyncClient(base_url=api.url) as c:
        spec = (await c.get("/api/v1/openapi.json")).json()
    assert "/jobs/{job_id}/events" in spec["paths"] and "/jobs/{job_id}/audit" in spec["paths"]
