"""The ASGI app factory: the dashboard at / and the JSON API at /api/v1, in one Starlette app that can run
on its own (`taskq web`, `taskq run --web-port`) or be mounted in an existing ASGI application:

    from taskq.web import create_app
    app.mount("/taskq", create_app(dsn))        # Starlette / FastAPI

Mounted, the host does not run this app's lifespan: the database pool opens on the first request. The app
answers only to the Host names it is told (loopback by default): mounted under another name, pass it,
`create_app(dsn, allowed_hosts=["ops.example.com"])`, or `["*"]` when the host application or a proxy
in front of it checks Host already.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend
from taskq.exceptions import ConfigurationError
from taskq.web import api, dashboard
from taskq.web.guard import AccessLog, Guard
from taskq.web.state import WebConfig, WebState

SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; "
     b"form-action 'self'; base-uri 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"x-frame-options", b"DENY"),
]


class SecurityHeaders:
    """CSP (no inline script), nosniff, no framing, on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                present = {k.lower() for k, _ in message["headers"]}
                message["headers"].extend(h for h in SECURITY_HEADERS if h[0] not in present)
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(
    dsn: str | None = None,
    *,
    backend: Backend | None = None,
    auth: bool = True,
    registry: ActorRegistry | None = None,
    config: WebConfig | None = None,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
) -> Starlette:
    """The dashboard and API over `dsn` (None: TASKQ_DSN, else the embedded server) or an open `backend`.
    `auth` False serves everyone with every grant: put it only behind loopback or your own auth.
    `allowed_hosts`: Host names it answers to besides the loopback ones (`"*"`: any);
    `allowed_origins`: origins whose pages may write besides its own (see WebConfig)."""
    cfg = config or WebConfig(dsn=dsn, auth=auth, registry=registry)
    if allowed_hosts or allowed_origins:
        if isinstance(allowed_hosts, str) or isinstance(allowed_origins, str):
            raise ConfigurationError("allowed_hosts and allowed_origins are lists of names, not one string")
        cfg = dataclasses.replace(cfg, allowed_hosts=(*cfg.allowed_hosts, *allowed_hosts),
                                  allowed_origins=(*cfg.allowed_origins, *allowed_origins))
    st = WebState(cfg, backend_given=backend)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await st.close()

    from importlib import resources

    # follow_symlink: an editable install links the files in from the source tree
    static = StaticFiles(directory=str(resources.files("taskq.web") / "static"), follow_symlink=True)
    app = Starlette(
        routes=[
            Mount("/api/v1", routes=api.routes()),
            Mount("/static", app=static, name="static"),
            *dashboard.routes(),
        ],
        middleware=[Middleware(AccessLog), Middleware(SecurityHeaders),
                    Middleware(Guard, allowed_hosts=cfg.allowed_hosts, allowed_origins=cfg.allowed_origins,
                               max_body_bytes=cfg.max_body_bytes)],
        lifespan=lifespan,
    )
    app.state.taskq = st
    return app
