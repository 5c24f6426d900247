"""Dashboard sessions (taskq.web.sessions, taskq.web_sessions): a login opens a server-side session whose
random id is all the cookie holds; logout ends it (the old cookie is refused afterwards), so do its idle and
absolute expiry and its token's revocation; its CSRF secret is its own, so a form rendered by one web
process posts to another. The apps run in-process (httpx's ASGI transport) on a real database."""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import UUID

import httpx
import pytest
from starlette.applications import Starlette
from testkit import query, wait_for

from taskq.backend import Backend
from taskq.ops.tokens import create_token, revoke_token
from taskq.web import WebConfig, create_app
from taskq.web.dashboard import COOKIE

pytestmark = pytest.mark.timeout(60)

LOCAL = "http://127.0.0.1:8765"


async def make_token(dsn: str, name: str = "ops", grants: tuple[str, ...] = ("*@*",)) -> str:
    backend = await Backend.open(dsn, max_size=1)
    try:
        return (await create_token(backend, name, list(grants)))[1]
    finally:
        await backend.close()


@asynccontextmanager
async def app_client(dsn: str, base_url: str = LOCAL, **config: object) -> AsyncIterator[httpx.AsyncClient]:
    app: Starlette = create_app(config=WebConfig(dsn=dsn, **config))  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url) as c:
            yield c
    finally:
        await app.state.taskq.close()


async def login(c: httpx.AsyncClient, token: str) -> str:
    r = await c.post("/login?next=/jobs", data={"token": token})
    assert r.status_code == 303 and r.headers["location"].endswith("/jobs"), r.text
    session_id = c.cookies.get(COOKIE)
    assert session_id
    return session_id


def job(dsn: str) -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES ('web.s', '{}') RETURNING id")
    return UUID(str(row[0]))


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found is not None, html
    return found.group(1)


async def test_the_cookie_holds_a_session_id_never_the_token(dsn: str) -> None:
    token = await make_token(dsn)
    async with app_client(dsn) as c:
        r = await c.post("/login", data={"token": token})
        cookie = r.headers["set-cookie"]
        session_id = c.cookies.get(COOKIE)
        assert session_id and token not in cookie and session_id != token
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age=86400" in cookie
        assert "Secure" not in cookie  # a loopback server over plain HTTP
        assert (await c.get("/jobs")).status_code == 200
    rows = query(dsn, "SELECT id_hash, token_name, expires_at - created_at, idle_expires_at - created_at,"
                      " ended_at FROM taskq.web_sessions")
    assert len(rows) == 1
    id_hash, name, absolute, idle, ended = rows[0]
    assert id_hash == hashlib.sha256(session_id.encode()).hexdigest() and name == "ops" and ended is None
    assert absolute.total_seconds() == 24 * 3600 and idle.total_seconds() == 8 * 3600


async def test_logout_ends_the_session_and_the_old_cookie_is_refused(dsn: str) -> None:
    token = await make_token(dsn)
    async with app_client(dsn) as c:
        session_id = await login(c, token)
        assert (await c.get("/jobs")).status_code == 200
        out = await c.post("/logout")
        assert out.status_code == 303 and out.headers["location"].endswith("/login")
        c.cookies.set(COOKIE, session_id)  # the old cookie, kept by whoever copied it
        again = await c.get("/jobs")
        assert again.status_code == 303 and "/login" in again.headers["location"]
    assert query(dsn, "SELECT ended_at IS NOT NULL FROM taskq.web_sessions") == [(True,)]


async def test_a_revoked_token_ends_its_sessions_at_once(dsn: str) -> None:
    token = await make_token(dsn)
    async with app_client(dsn) as c:
        await login(c, token)
        assert (await c.get("/jobs")).status_code == 200
        backend = await Backend.open(dsn, max_size=1)
        try:
            await revoke_token(backend, "ops")
        finally:
            await backend.close()
        # no cache in between: the next page already goes to the login
        r = await c.get("/jobs")
        assert r.status_code == 303 and "/login" in r.headers["location"]
        assert (await c.post("/login", data={"token": token})).status_code == 401
    assert query(dsn, "SELECT ended_at IS NOT NULL FROM taskq.web_sessions") == [(True,)]


async def test_a_session_expires_when_idle_and_past_its_absolute_limit(dsn: str) -> None:
    token = await make_token(dsn)
    async with app_client(dsn, session_idle_seconds=1.0) as c:
        await login(c, token)
        assert (await c.get("/jobs")).status_code == 200

        # unused for a second: the session is over
        await wait_for(lambda: query(dsn, "SELECT idle_expires_at < now() FROM taskq.web_sessions")[0][0], timeout=20)
        assert (await c.get("/jobs")).status_code == 303
        assert (await c.get("/jobs")).status_code == 303  # a refused request does not revive it
    async with app_client(dsn) as c:
        await login(c, token)
        assert (await c.get("/jobs")).status_code == 200
        # used all along, but past its absolute limit (the database's clock decides)
        query(dsn, "UPDATE taskq.web_sessions SET expires_at = now() - interval '1 second',"
                   " idle_expires_at = now() - interval '1 second' WHERE ended_at IS NULL")
        assert (await c.get("/jobs")).status_code == 303


async def test_the_idle_expiry_moves_with_use_but_never_past_the_absolute_limit(dsn: str) -> None:
    token = await make_token(dsn)
    async with app_client(dsn, session_idle_seconds=600.0, session_max_seconds=900.0) as c:
        await login(c, token)
        query(dsn, "UPDATE taskq.web_sessions SET last_seen_at = now() - interval '5 minutes',"
                   " idle_expires_at = now() + interval '5 minutes'")
        assert (await c.get("/jobs")).status_code == 200
    (moved,) = query(dsn, "SELECT idle_expires_at > now() + interval '9 minutes', idle_expires_at <= expires_at,"
                          " last_seen_at > now() - interval '1 minute' FROM taskq.web_sessions")
    assert moved == (True, True, True)


async def test_a_csrf_token_from_one_app_instance_works_on_another(dsn: str) -> None:
    """Each session has its own CSRF secret in the database: two web processes (or one restarted) accept
    each other's forms."""
    token = await make_token(dsn)
    jid = job(dsn)
    async with app_client(dsn) as first, app_client(dsn) as second:
        session_id = await login(first, token)
        page = await first.get(f"/jobs/{jid}")
        csrf = csrf_of(page.text)
        second.cookies.set(COOKIE, session_id)
        forged = await second.post(f"/jobs/{jid}/cancel", data={"csrf": "0" * 40, "expected_revision": "1"})
        assert forged.status_code == 403
        posted = await second.post(f"/jobs/{jid}/cancel", data={"csrf": csrf, "expected_revision": "1",
                                                                "idempotency_key": "s-1"})
        assert posted.status_code == 303, posted.text
        # another session's form token is not this one's
        other = await login(first, token)
        assert other != session_id
        limits = "/queues/default/limits"
        assert csrf_of((await first.get(limits)).text) != csrf_of((await second.get(limits)).text)
    assert query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", jid) == [("cancelled",)]
    assert query(dsn, "SELECT principal, db_role IS NOT NULL FROM taskq.operator_audit WHERE job_id = %s", jid
                 ) == [("ops", True)]


async def test_a_login_deletes_unusable_sessions_in_a_bounded_batch(dsn: str) -> None:
    token = await make_token(dsn)
    query(dsn, "INSERT INTO taskq.web_sessions (id_hash, token_name, csrf_secret, idle_expires_at, expires_at,"
               " ended_at) SELECT encode(sha256(i::text::bytea), 'hex'), 'ops', repeat('a', 64),"
               " now() - interval '1 hour', now() - interval '1 hour', CASE WHEN mod(i, 2) = 0 THEN now() END"
               " FROM generate_series(1, 150) AS i")
    async with app_client(dsn) as c:
        await login(c, token)
        left = query(dsn, "SELECT count(*) FROM taskq.web_sessions")[0][0]
        assert 1 < left <= 51  # at most 100 deleted per login, the new one kept
        await login(c, token)
    assert query(dsn, "SELECT count(*) FROM taskq.web_sessions WHERE expires_at < now()") == [(0,)]


@pytest.mark.parametrize(("base_url", "forced", "secure"), [
    (LOCAL, None, False), ("http://[::1]:8765", None, False), ("http://testserver", None, True),
    ("http://10.1.2.3:8765", None, True), ("https://127.0.0.1:8765", None, True), (LOCAL, True, True),
    ("http://10.1.2.3:8765", False, False),
])
async def test_the_cookie_is_secure_unless_served_over_plain_http_on_loopback(
    dsn: str, base_url: str, forced: bool | None, secure: bool
) -> None:
    token = await make_token(dsn)
    # the Host check is not under test here: any name is answered
    async with app_client(dsn, base_url, secure_cookies=forced, allowed_hosts=("*",)) as c:
        r = await c.post("/login", data={"token": token})
        assert r.status_code == 303
        assert ("Secure" in r.headers["set-cookie"]) is secure, r.headers["set-cookie"]


@pytest.mark.parametrize("cookie", ["", "x" * 5000, "tq_not-a-session", "%C3%A9t%C3%A9", "'; DROP TABLE x; --"])
async def test_a_bad_session_cookie_goes_to_the_login(dsn: str, cookie: str) -> None:
    async with app_client(dsn) as c:
        c.cookies.set(COOKIE, cookie)
        r = await c.get("/jobs")
        assert r.status_code == 303 and "/login" in r.headers["location"]
        assert (await c.post("/logout")).status_code == 303


async def test_an_api_token_is_no_session_cookie(dsn: str) -> None:
    """The cookie used to be the token itself: a token sent as the cookie opens nothing now."""
    token = await make_token(dsn)
    async with app_client(dsn) as c:
        c.cookies.set(COOKIE, token)
        r = await c.get("/jobs")
        assert r.status_code == 303 and "/login" in r.headers["location"]
