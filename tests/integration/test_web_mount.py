"""taskq.web.create_app mounted under a prefix in a host ASGI application (in process, through httpx's
ASGITransport, against a real database): the host runs no lifespan of ours, so the pool opens on first
use; links, the login redirect and the session cookie carry the prefix."""

from __future__ import annotations

import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from testkit import query

from taskq.backend import Backend
from taskq.ops.tokens import create_token
from taskq.web import create_app


async def test_the_app_works_mounted_under_a_prefix(dsn: str) -> None:
    backend = await Backend.open(dsn)
    try:
        _, token = await create_token(backend, "host", ["*@*"])
    finally:
        await backend.close()
    (job,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES ('mounted', '1') RETURNING id")

    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("host app")

    taskq_app = create_app(dsn, allowed_hosts=["testserver"])
    host = Starlette(routes=[Route("/", home), Mount("/taskq", app=taskq_app)])
    transport = httpx.ASGITransport(app=host)
    try:
        # https: the session cookie is Secure off loopback, and a client sends it back over https only
        async with httpx.AsyncClient(transport=transport, base_url="https://testserver") as c:
            assert (await c.get("/")).text == "host app"
            api = await c.get("/taskq/api/v1/jobs", headers={"Authorization": f"Bearer {token}"})
            assert api.status_code == 200 and [j["id"] for j in api.json()["jobs"]] == [str(job[0])]
            page = await c.get("/taskq/jobs")
            assert page.status_code == 303 and page.headers["location"].startswith("/taskq/login")
            login = await c.post("/taskq/login?next=/jobs", data={"token": token})
            assert login.status_code == 303 and login.headers["location"] == "/taskq/jobs"
            assert "Path=/taskq" in login.headers["set-cookie"] and "SameSite=strict" in login.headers["set-cookie"]
            listed = await c.get("/taskq/jobs")
            assert listed.status_code == 200
            assert 'href="/taskq/static/taskq.css"' in listed.text and f'href="/taskq/jobs/{job[0]}"' in listed.text
            assert (await c.get("/taskq/static/htmx.min.js")).status_code == 200
            assert listed.headers["content-security-policy"].startswith("default-src 'self'")
    finally:
        await taskq_app.state.taskq.close()


async def test_a_dashboard_post_without_its_csrf_token_is_refused(dsn: str) -> None:
    (job,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES ('csrf', '1') RETURNING id")
    app = create_app(dsn, auth=False, allowed_hosts=["testserver"])
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver") as c:
            forged = await c.post(f"/jobs/{job[0]}/cancel", data={"reason": "forged"})
            assert forged.status_code == 403
            cross = await c.post(f"/jobs/{job[0]}/cancel", data={"csrf": "x"}, headers={"Sec-Fetch-Site": "cross-site"})
            assert cross.status_code == 403
    finally:
        await app.state.taskq.close()
    assert query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", job[0])[0][0] == "pending"
