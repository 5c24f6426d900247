"""The web app's request guard and its database bounds, in process (httpx's ASGITransport) against a real
database: Host (DNS rebinding), Origin and Sec-Fetch-Site on writes (CSRF with auth off), the Content-Type
a write must carry (415), body and form limits on every route (413, 400), deep JSON (400, no traceback),
503s that name no server, the statement timeout (503, through PgBouncer too, and leaking to no other
client), the relative Location, and the token cache's LRU."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from starlette.applications import Starlette
from testkit import query

from taskq.backend import Backend
from taskq.ops.tokens import create_token
from taskq.web import WebConfig, create_app

ORIGIN = "http://localhost"


@asynccontextmanager
async def client_of(app: Starlette, base_url: str = ORIGIN) -> AsyncIterator[httpx.AsyncClient]:
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url, timeout=30) as c:
            yield c
    finally:
        await app.state.taskq.close()


def pending_job(dsn: str, queue: str = "guarded") -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload) VALUES ('guard.test', %s, '{}') RETURNING id",
                   queue)
    return UUID(str(row[0]))


def status_of(dsn: str, job: UUID) -> str:
    return str(query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", job)[0][0])


# -- Host -------------------------------------------------------------------------------------------

async def test_a_foreign_host_is_refused_before_any_route_and_loopback_names_pass(dsn: str) -> None:
    async with client_of(create_app(dsn, auth=False)) as c:
        rebound = await c.get("/api/v1/jobs", headers={"Host": "attacker.example:18766"})
        assert rebound.status_code == 400
        assert rebound.headers["content-type"] == "application/problem+json"
        detail = rebound.json()["detail"]
        assert "attacker.example:18766" in detail and "--allowed-host attacker.example" in detail
        page = await c.get("/", headers={"Host": "attacker.example"})
        assert page.status_code == 400 and 'name="csrf"' not in page.text
        for host in ("localhost", "localhost:8765", "127.0.0.1:1", "[::1]:8765", "LOCALHOST"):
            assert (await c.get("/api/v1/jobs", headers={"Host": host})).status_code == 200, host


async def test_allowed_hosts_add_names_and_star_turns_the_check_off(dsn: str) -> None:
    async with client_of(create_app(dsn, auth=False, allowed_hosts=["ops.example.com", ".corp.example"])) as c:
        assert (await c.get("/api/v1/jobs", headers={"Host": "ops.example.com:443"})).status_code == 200
        assert (await c.get("/api/v1/jobs", headers={"Host": "a.corp.example"})).status_code == 200
        assert (await c.get("/api/v1/jobs", headers={"Host": "localhost"})).status_code == 200
        assert (await c.get("/api/v1/jobs", headers={"Host": "evil.example"})).status_code == 400
    async with client_of(create_app(dsn, auth=False, allowed_hosts=["*"])) as c:
        assert (await c.get("/api/v1/jobs", headers={"Host": "anything.example"})).status_code == 200


# -- writes from another site -------------------------------------------------------------------------

async def test_cross_site_writes_are_refused_with_auth_off(dsn: str) -> None:
    job = pending_job(dsn)
    body = json.dumps({"filter": {"queue": "guarded"}, "limit": 1000, "reason": "="})
    async with client_of(create_app(dsn, auth=False)) as c:
        # what a page of another site can send without a preflight: text/plain, or a form
        plain = await c.post("/api/v1/jobs:cancel", content=body,
                             headers={"Content-Type": "text/plain", "Origin": "https://evil.example",
                                      "Sec-Fetch-Site": "cross-site"})
        assert plain.status_code == 403
        for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                        {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                        {"Origin": "http://localhost:9999"}):
            refused = await c.post("/api/v1/jobs:cancel", content=body,
                                   headers={"Content-Type": "application/json", **headers})
            assert refused.status_code == 403, headers
            assert refused.headers["content-type"] == "application/problem+json"
        form = await c.post("/api/v1/queues/guarded:pause", data={"reason": "="})
        assert form.status_code == 415
        text = await c.post("/api/v1/jobs:cancel", content=body, headers={"Content-Type": "text/plain"})
        assert text.status_code == 415 and "application/json" in text.json()["detail"]
        assert status_of(dsn, job) == "pending"
        paused = "SELECT count(*) FROM taskq.queues WHERE name = 'guarded' AND paused_at IS NOT NULL"
        assert query(dsn, paused) == [(0,)]
        own = await c.post("/api/v1/jobs:cancel", content=body,
                           headers={"Content-Type": "application/json; charset=utf-8", "Origin": ORIGIN,
                                    "Sec-Fetch-Site": "same-origin"})
        assert own.status_code == 200, own.text
    assert status_of(dsn, job) == "cancelled"


async def test_allowed_origins_may_write_and_an_empty_write_needs_no_content_type(dsn: str) -> None:
    query(dsn, "INSERT INTO taskq.queues (name) VALUES ('guarded') ON CONFLICT DO NOTHING")
    app = create_app(dsn, auth=False, allowed_origins=["https://ops.example.com"])
    async with client_of(app) as c:
        paused = await c.post("/api/v1/queues/guarded:pause", headers={"Origin": "https://ops.example.com"})
        assert paused.status_code == 200, paused.text
        refused = await c.post("/api/v1/queues/guarded:resume", headers={"Origin": "https://other.example.com"})
        assert refused.status_code == 403


async def test_dashboard_writes_take_urlencoded_forms_only(dsn: str) -> None:
    job = pending_job(dsn)
    async with client_of(create_app(dsn, auth=False)) as c:
        upload = await c.post(f"/jobs/{job}/cancel", data={"csrf": "x"}, files={"f": ("a.bin", b"\0" * 1000)})
        assert upload.status_code == 415
        as_json = await c.post(f"/jobs/{job}/cancel", json={"csrf": "x"})
        assert as_json.status_code == 415
        cross = await c.post(f"/jobs/{job}/cancel", data={"csrf": "x"}, headers={"Origin": "https://evil.example"})
        assert cross.status_code == 403
    assert status_of(dsn, job) == "pending"


# -- sizes ----------------------------------------------------------------------------------------------

async def test_login_refuses_large_forms_uploads_and_bodies_before_reading_them(dsn: str) -> None:
    async with client_of(create_app(dsn)) as c:
        big = await c.post("/login", data={f"f{i}": "x" * 100_000 for i in range(40)})  # 4 MB
        assert big.status_code == 413
        upload = await c.post("/login", files={"token": ("t.bin", b"\0" * 2_000_000)})
        assert upload.status_code in (413, 415)
        small_upload = await c.post("/login", files={"token": ("t.bin", b"tq_x")})
        assert small_upload.status_code == 415

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the streamed size counts
            for i in range(36):  # each field and their number within the form limits, their sum not
                yield f"f{i:02d}=".encode() + b"x" * 30_000 + b"&"

        streamed = await c.post("/login", content=chunks(),
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert streamed.status_code == 413
        many = await c.post("/login", data={f"f{i}": "x" for i in range(500)})
        assert many.status_code == 400
        long_field = await c.post("/login", data={"token": "x" * 200_000})
        assert long_field.status_code == 400
        bad = await c.post("/login", data={"token": "tq_nobody"})
        assert bad.status_code == 401


async def test_every_route_has_the_body_limit(dsn: str) -> None:
    config = WebConfig(dsn=dsn, auth=False, max_body_bytes=10_000)
    async with client_of(create_app(config=config)) as c:
        for path in ("/api/v1/jobs", "/api/v1/nope", "/jobs/bulk", "/logout", "/static/taskq.css"):
            declared = await c.post(path, content=b"{}" + b" " * 20_000,
                                    headers={"Content-Type": "application/json" if "api" in path
                                             else "application/x-www-form-urlencoded"})
            assert declared.status_code == 413, path
            if path not in ("/api/v1/jobs", "/jobs/bulk"):
                continue  # a route that reads no body reads no more of it than that

            async def chunks() -> AsyncIterator[bytes]:
                for _ in range(10):
                    yield b" " * 4_000

            streamed = await c.post(path, content=chunks(),
                                    headers={"Content-Type": "application/json" if "api" in path
                                             else "application/x-www-form-urlencoded"})
            assert streamed.status_code == 413, path


async def test_deeply_nested_json_is_a_400_without_a_traceback(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    depth = 100_000
    payload = "[" * depth + "]" * depth
    body = '{"actor": "guard.deep", "queue": "guarded", "payload": ' + payload + "}"
    caplog.set_level(logging.INFO)
    async with client_of(create_app(dsn, auth=False)) as c:
        r = await c.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["code"] == "INVALID_ARGUMENT"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE actor = 'guard.deep'") == [(0,)]


# -- the database ---------------------------------------------------------------------------------------

SECRET_DSN = "postgresql://taskq_client:TopS3cret@127.0.0.1:1/app?sslpassword=KeyPassphrase&connect_timeout=2"


async def test_an_unreachable_database_answers_503_naming_no_server(caplog: pytest.LogCaptureFixture) -> None:
    async with client_of(create_app(SECRET_DSN)) as c:
        api = await c.get("/api/v1/jobs", headers={"Authorization": "Bearer tq_anything"})
        login = await c.post("/login", data={"token": "tq_x"})
        c.cookies.set("taskq_session", "tq_anything")
        page = await c.get("/")
    assert (api.status_code, page.status_code, login.status_code) == (503, 503, 503)
    assert api.headers["content-type"] == "application/problem+json"
    for text in (api.text, page.text, login.text):
        for secret in ("127.0.0.1", "taskq_client", "KeyPassphrase", "TopS3cret", ":1/"):
            assert secret not in text
    assert "KeyPassphrase" not in caplog.text and "TopS3cret" not in caplog.text


async def test_a_statement_past_the_timeout_answers_503_and_the_pool_recovers(dsn: str) -> None:
    config = WebConfig(dsn=dsn, auth=False, statement_timeout=0.3)
    async with client_of(create_app(config=config)) as c:
        assert (await c.get("/api/v1/jobs")).status_code == 200
        await _with_jobs_locked(dsn, c, expect_503=True)
        assert (await c.get("/api/v1/jobs")).status_code == 200


async def _with_jobs_locked(dsn: str, c: httpx.AsyncClient, *, expect_503: bool) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as locker:
        await locker.execute("LOCK TABLE taskq.jobs IN ACCESS EXCLUSIVE MODE")
        try:
            r = await asyncio.wait_for(c.get("/api/v1/jobs"), timeout=20)
        finally:
            await locker.rollback()
    if expect_503:
        assert r.status_code == 503, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert "statement timeout" in r.json()["detail"]


async def test_the_statement_timeout_holds_through_pgbouncer_and_leaks_to_no_other_client(
        dsn: str, pooled_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKQ_TRANSACTION_POOLER", "1")
    config = WebConfig(dsn=pooled_dsn, auth=False, statement_timeout=0.3)
    async with client_of(create_app(config=config)) as c:
        for _ in range(5):
            assert (await c.get("/api/v1/jobs")).status_code == 200
        await _with_jobs_locked(dsn, c, expect_503=True)
        assert (await c.get("/api/v1/stats")).status_code == 200
        # the server connections the web used, now someone else's: no statement_timeout of ours on them
        async with await psycopg.AsyncConnection.connect(pooled_dsn, autocommit=True,
                                                         prepare_threshold=None) as other:
            for _ in range(10):
                shown = await (await other.execute("SHOW statement_timeout")).fetchone()
                assert shown == ("0",)


# -- responses and caches -------------------------------------------------------------------------------

async def test_the_202_location_is_a_path_not_built_from_host(dsn: str) -> None:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload, status, attempt, claim_epoch, worker_id,"
                        " lock_expires_at, started_at) VALUES ('guard.run', 'guarded', '{}', 'running', 1, 1, 'w1',"
                        " now() + interval '1 hour', now()) RETURNING id")
    async with client_of(create_app(dsn, auth=False, allowed_hosts=["*"]), base_url="http://evil.example") as c:
        r = await c.post(f"/api/v1/jobs/{row[0]}:cancel", json={})
        assert r.status_code == 202, r.text
        assert r.headers["location"] == f"/api/v1/jobs/{row[0]}"


async def test_bogus_tokens_do_not_flush_a_real_tokens_cached_principal(dsn: str) -> None:
    backend = await Backend.open(dsn)
    try:
        _, token = await create_token(backend, "real", ["*@*"])
    finally:
        await backend.close()
    app = create_app(dsn)
    state: Any = app.state.taskq
    try:
        assert (await state.principal(token)).name == "real"
        # revoked in the database: only the cache still knows it, so a second answer comes from the cache
        query(dsn, "UPDATE taskq.api_tokens SET revoked_at = now() WHERE name = 'real'")
        for i in range(1500):
            assert await state.principal(f"tq_bogus_{i}") is None
        who = await state.principal(token)
        assert who is not None and who.name == "real"
    finally:
        await state.close()


async def test_access_lines_name_the_principal_never_the_token(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    backend = await Backend.open(dsn)
    try:
        _, token = await create_token(backend, "logged", ["*@*"])
    finally:
        await backend.close()
    caplog.set_level(logging.INFO, logger="taskq.web.access")
    async with client_of(create_app(dsn)) as c:
        ok = await c.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}", "X-Request-Id": "rid-1"})
        assert ok.status_code == 200
        assert (await c.get("/api/v1/jobs/x", headers={"Authorization": "Bearer tq_wrong"})).status_code == 401
        assert (await c.post("/login", data={"token": "tq_wrong"})).status_code == 401
    lines = [r for r in caplog.records if r.name == "taskq.web.access"]
    assert token not in caplog.text and "tq_wrong" not in caplog.text
    fields = [r.__dict__["fields"] for r in lines]
    assert {"principal": "logged", "method": "GET", "route": "/api/v1/jobs", "status": 200,
            "request_id": "rid-1"}.items() <= fields[0].items()
    warned = [r for r in lines if r.levelno == logging.WARNING]
    assert [r.__dict__["fields"]["route"] for r in warned] == ["/api/v1/jobs/{job_id}", "/login"]
    assert all(r.__dict__["fields"]["client"] for r in warned)
