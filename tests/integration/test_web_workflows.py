"""The web API of issue 32 against a real server process: POST /jobs/{id}:signal (grant jobs:signal, audit,
idempotency), POST /workflows/{id}:cancel (scoping, counts, audit), a job's steps, signals and suspension
in GET /jobs/{id}, and the jobs list's workflow_id and waiting filters."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from testkit import WebServer, query

from taskq import JobsClient
from taskq.backend import Backend
from taskq.ops.tokens import create_token

pytestmark = pytest.mark.timeout(120)

GRANTS = {
    "admin": ["*@*"],
    "reader": ["jobs:read@*"],
    "canceller": ["jobs:read@*", "jobs:cancel@*"],
    "billing": ["jobs:read@billing-*", "jobs:cancel@billing-*", "jobs:signal@billing-*"],
    "blind": ["jobs:cancel@elsewhere"],
}


@dataclass
class Api:
    url: str
    tokens: dict[str, str]
    dsn: str

    def client(self, token: str = "admin") -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url + "/api/v1", timeout=30,
                                 headers={"Authorization": f"Bearer {self.tokens[token]}"})


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[WebServer]:
    web = WebServer(dsn, log_path=tmp_path / "web.log")
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
    query(dsn, "DELETE FROM taskq.operator_audit")
    yield Api(server.url, tokens, dsn)


def problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code and body["detail"], body
    return body


def audit_of(dsn: str, jid: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT principal, action, outcome, detail FROM taskq.operator_audit WHERE job_id = %s"
                      " ORDER BY id", jid)


def suspend(dsn: str, jid: UUID, kind: str, signal: str | None, until: str) -> None:
    """Leave a job as a worker's sleep or wait leaves it (the worker side is not under test here)."""
    query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'scheduled', wait_kind = %s,"
               " wait_signal = %s, scheduled_at = %s::timestamptz WHERE id = %s", kind, signal, until, jid)


# -- POST /jobs/{id}:signal ----------------------------------------------------------------------------


async def test_signal_is_stored_audited_in_its_transaction_and_replayed_by_its_key(
    api: Api, client: JobsClient
) -> None:
    handle = await client.enqueue("web.wf", {}, queue="billing-eu")
    jid = handle.job_id
    async with api.client("billing") as c:
        first = await c.post(f"/jobs/{jid}:signal", json={"name": "approved", "payload": {"by": "ann"}},
                             headers={"Idempotency-Key": "sig-1"})
        again = await c.post(f"/jobs/{jid}:signal", json={"name": "approved", "payload": {"by": "ann"}},
                             headers={"Idempotency-Key": "sig-1"})
        other = await c.post(f"/jobs/{jid}:signal", json={"name": "approved", "payload": {"by": "bob"}},
                             headers={"Idempotency-Key": "sig-1"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["name"] == "approved" and body["woke"] is False and body["job"]["id"] == str(jid)
    assert again.status_code == 200 and again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == body
    problem(other, 422, "IDEMPOTENCY_KEY_REUSED")
    signals = await client.signals(jid)
    assert [(s.id, s.name, s.payload, s.sent_by) for s in signals] == [
        (body["signal_id"], "approved", {"by": "ann"}, "billing")]
    rows = audit_of(api.dsn, jid)
    assert [(r[0], r[1], r[2]) for r in rows] == [("billing", "jobs:signal", "signalled")]
    assert rows[0][3]["signal"] == "approved" and rows[0][3]["signal_id"] == body["signal_id"]
    kinds = [e.kind for e in await client.events(jid)]
    assert "operator" in kinds


async def test_signal_wakes_a_job_waiting_for_that_name(api: Api, client: JobsClient) -> None:
    jid = (await client.enqueue("web.wf", {})).job_id
    suspend(api.dsn, jid, "signal", "approved", "9999-12-31T00:00:00Z")
    async with api.client() as c:
        detail = (await c.get(f"/jobs/{jid}")).json()
        assert detail["suspended"] == {"kind": "signal", "signal": "approved", "until": None,
                                       "text": "waiting for signal 'approved' (no timeout)"}
        woke = await c.post(f"/jobs/{jid}:signal", json={"name": "approved"})
    assert woke.status_code == 200 and woke.json()["woke"] is True


async def test_signal_errors_unknown_job_ended_job_bad_name_bad_payload_and_missing_grant(
    api: Api, client: JobsClient
) -> None:
    done = (await client.enqueue("web.wf", {})).job_id
    await client.cancel(done)
    live = (await client.enqueue("web.wf", {})).job_id
    async with api.client() as c:
        problem(await c.post(f"/jobs/{uuid4()}:signal", json={"name": "x"}), 404, "NOT_FOUND")
        ended = problem(await c.post(f"/jobs/{done}:signal", json={"name": "x"}), 409, "STATE_CONFLICT")
        assert "ended (cancelled)" in ended["detail"] and ended["job"]["status"] == "cancelled"
        for name, fragment in (("", "must not be empty"), ("n" * 201, "the limit is 200"), ("a\nb", "control")):
            bad = problem(await c.post(f"/jobs/{live}:signal", json={"name": name}), 400, "INVALID_ARGUMENT")
            assert bad["detail"].startswith("name: ") and fragment in bad["detail"], bad
        missing = problem(await c.post(f"/jobs/{live}:signal", json={"payload": 1}), 400, "INVALID_ARGUMENT")
        assert "name" in missing["detail"]
        nul = problem(await c.post(f"/jobs/{live}:signal", json={"name": "x", "payload": "a\u0000b"}), 400,
                      "INVALID_ARGUMENT")
        assert nul["detail"].startswith("payload: ")
        big = await c.post(f"/jobs/{live}:signal", json={"name": "x", "payload": "y" * (1024 * 1024 + 1)})
        assert big.status_code in (400, 413) and ("payload" in big.json()["detail"] or big.status_code == 413)
        unknown = problem(await c.post(f"/jobs/{live}:signal", json={"name": "x", "extra": 1}), 400,
                          "INVALID_ARGUMENT")
        assert "extra" in unknown["detail"]
    async with api.client("canceller") as c:
        denied = problem(await c.post(f"/jobs/{live}:signal", json={"name": "x"}), 403, "PERMISSION_DENIED")
        assert "jobs:signal" in denied["detail"]
    assert await client.signals(live) == [] and await client.signals(done) == []
    assert [r[2] for r in audit_of(api.dsn, done)] == ["conflict"]
    assert audit_of(api.dsn, live) == []


async def test_tokens_can_be_created_with_the_jobs_signal_grant(dsn: str) -> None:
    backend = await Backend.open(dsn)
    try:
        info, _ = await create_token(backend, "signaller", ["jobs:signal@orders"])
    finally:
        await backend.close()
    assert [str(g) for g in info.grants] == ["jobs:signal@orders"]


# -- POST /workflows/{id}:cancel ---------------------------------------------------------------------------


async def test_workflow_cancel_counts_audits_each_member_and_replays(api: Api, client: JobsClient) -> None:
    async with client.workflow() as wf:
        a = wf.enqueue("web.wf", {}, queue="billing-eu")
        b = wf.enqueue("web.wf", {}, queue="billing-us", depends_on=[a])
        done = wf.enqueue("web.wf", {}, queue="billing-eu")
    await client.cancel(done.job_id)
    async with api.client("billing") as c:
        first = await c.post(f"/workflows/{wf.id}:cancel", json={"reason": "refund"},
                             headers={"Idempotency-Key": "wf-1"})
        again = await c.post(f"/workflows/{wf.id}:cancel", json={"reason": "refund"},
                             headers={"Idempotency-Key": "wf-1"})
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["cancelled"], body["cancel_requested"], body["already_ended"], body["members"]) == (2, 0, 1, 3)
    assert set(body["job_ids"]) == {str(a.job_id), str(b.job_id)}
    assert again.json() == body and again.headers["Idempotent-Replayed"] == "true"
    for member in (a, b):
        rows = audit_of(api.dsn, member.job_id)
        assert [(r[1], r[2], r[3]["workflow_id"]) for r in rows] == [("jobs:cancel", "cancelled", str(wf.id))]
        row = await client.backend.get(member.job_id)
        assert row is not None and row.status == "cancelled" and row.cancel_reason == "refund"


async def test_workflow_cancel_scoping_unknown_and_malformed_ids(api: Api, client: JobsClient) -> None:
    async with client.workflow() as wf:
        inside = wf.enqueue("web.wf", {}, queue="billing-eu")
        wf.enqueue("web.wf", {}, queue="shipping")
    async with api.client("billing") as c:
        denied = problem(await c.post(f"/workflows/{wf.id}:cancel"), 403, "PERMISSION_DENIED")
        assert "jobs:cancel" in denied["detail"]  # 'shipping' is not the token's to read: not named
        assert "shipping" not in denied["detail"]
    async with api.client("reader") as c:
        named = problem(await c.post(f"/workflows/{wf.id}:cancel"), 403, "PERMISSION_DENIED")
        assert "'billing-eu'" in named["detail"]
    async with api.client("blind") as c:
        problem(await c.post(f"/workflows/{wf.id}:cancel"), 404, "NOT_FOUND")
    async with api.client() as c:
        problem(await c.post(f"/workflows/{uuid4()}:cancel"), 404, "NOT_FOUND")
        bad = problem(await c.post("/workflows/not-a-uuid:cancel"), 400, "INVALID_ARGUMENT")
        assert "not a workflow id" in bad["detail"]
        problem(await c.post(f"/workflows/{wf.id}:cancel", json={"reason": "x" * 10_001}), 400, "INVALID_ARGUMENT")
    row = await client.backend.get(inside.job_id)
    assert row is not None and row.status == "pending"
    assert audit_of(api.dsn, inside.job_id) == []


# -- reads -------------------------------------------------------------------------------------------------


async def test_job_detail_shows_steps_signals_and_suspension(api: Api, client: JobsClient) -> None:
    jid = (await client.enqueue("web.wf", {})).job_id
    query(api.dsn, "INSERT INTO taskq.job_steps (job_id, kind, name, attempt, claim_epoch, result)"
                   " VALUES (%s, 'step', 'charge', 1, 1, '{\"amount\": 5}')", jid)
    await client.signal(jid, "approved", {"ok": True})
    suspend(api.dsn, jid, "sleep", None, "2031-01-02T03:04:05Z")
    async with api.client() as c:
        detail = (await c.get(f"/jobs/{jid}")).json()
    assert [(s["kind"], s["name"], s["attempt"], s["result"]) for s in detail["steps"]] == [
        ("step", "charge", 1, {"amount": 5})]
    assert [(s["name"], s["payload"], s["consumed_at"]) for s in detail["signals"]] == [
        ("approved", {"ok": True}, None)]
    assert detail["suspended"]["kind"] == "sleep" and detail["suspended"]["text"].startswith("sleeping until 2031")


async def test_jobs_list_filters_on_workflow_id_and_waiting(api: Api, client: JobsClient) -> None:
    async with client.workflow() as wf:
        member = wf.enqueue("web.wf", {})
    sleeper = (await client.enqueue("web.wf", {})).job_id
    waiter = (await client.enqueue("web.wf", {})).job_id
    suspend(api.dsn, sleeper, "sleep", None, "2031-01-01T00:00:00Z")
    suspend(api.dsn, waiter, "signal", "go", "2031-01-01T00:00:00Z")
    async with api.client() as c:
        async def ids(**params: str) -> set[str]:
            r = await c.get("/jobs", params=params)
            assert r.status_code == 200, r.text
            return {j["id"] for j in r.json()["jobs"]}

        assert await ids(workflow_id=str(wf.id)) == {str(member.job_id)}
        assert await ids(waiting="sleep") == {str(sleeper)}
        assert await ids(waiting="signal") == {str(waiter)}
        assert await ids(waiting="any") == {str(sleeper), str(waiter)}
        bad = problem(await c.get("/jobs", params={"waiting": "forever"}), 400, "INVALID_ARGUMENT")
        assert "waiting must be one of" in bad["detail"]
        problem(await c.get("/jobs", params={"workflow_id": "nope"}), 400, "INVALID_ARGUMENT")
