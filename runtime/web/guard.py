"""The checks every request of the web app passes before any route sees it, and its access log.

`Guard` (an ASGI middleware) refuses:
- a `Host` that is not one of the allowed names (400): a page of another site that rebinds its own name
  to this server's address then reaches nothing (DNS rebinding);
- a write (POST, PUT, PATCH, DELETE) that a browser says another site sent: an `Origin` that is neither
  the request's own nor an allowed one, or `Sec-Fetch-Site: cross-site|same-site` (403);
- a write whose body is not of the kind its route reads (415): `application/json` for the API, a
  urlencoded form for the dashboard. A browser sends neither cross-site without a CORS preflight, which
  this app never grants, and no multipart upload is ever parsed;
- a body larger than `max_body_bytes` (413), by its `Content-Length` and by what actually arrives.

`AccessLog` writes one line per request to the logger `taskq.web.access` (principal name, method, route,
status, request id, duration); refusals of credentials (401, 403) at WARNING with the client's address.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.datastructures import FormData, Headers
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskq.web.problems import PROBLEM_TYPE, Problem

DEFAULT_ALLOWED_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
"""The names a web app answers to unless told others: the loopback ones, on any port."""
ANY_HOST = "*"
"""In `allowed_hosts`: no Host check at all (behind a reverse proxy that checks Host itself)."""

FORM_FIELDS = 40
"""At most this many fields in a dashboard form (the largest, the bulk form, has about fifteen)."""
FORM_PART_BYTES = 32 * 1024
"""At most this many bytes (URL-encoded) in one field of a dashboard form."""

API_PREFIX = "/api/v1"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_DEFAULT_PORTS = {"http": "80", "https": "443"}

_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,200}$")

access_log = logging.getLogger("taskq.web.access")


def ensure_request_id(scope: Scope) -> str:
    """The request's id: its X-Request-Id when that is 1-200 visible ASCII characters, else a new one."""
    rid = scope.get("taskq.request_id")
    if rid is None:
        given = Headers(scope=scope).get("x-request-id", "")
        rid = given if _REQUEST_ID.match(given) else uuid.uuid4().hex
        scope["taskq.request_id"] = rid
    return str(rid)


def too_large(limit: int) -> Problem:
    """More of a body than `max_body_bytes`: raised from the body's stream (answered 413 by the handler
    reading it, or by Guard) or answered at once for its Content-Length."""
    return Problem(413, "TOO_LARGE", f"the body is larger than {limit} bytes")


def route_path(scope: Scope) -> str:
    """The path inside this app (without the prefix it is mounted under)."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    return path[len(root):] if root and path.startswith(root) else path


def _split_host(value: str) -> tuple[str, str]:
    """(name, port) of a Host header or an origin's authority; the name lower case, IPv6 in brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, ""
        return value[: end + 1], value[end + 2:] if value[end + 1: end + 2] == ":" else ""
    name, _, port = value.partition(":")
    return name, port


def normalise_host(name: str) -> str:
    """An allowed-host entry as the check compares it: lower case, an IPv6 address in brackets."""
    name = name.strip().lower()
    if ":" in name and not name.startswith("["):
        return f"[{name}]"
    return name


def host_allowed(host: str, allowed: Iterable[str]) -> bool:
    """Whether the name of `host` (any port) is one of `allowed`; `.example.com` also allows its subdomains."""
    name, _ = _split_host(host)
    if not name:
        return False
    for entry in allowed:
        if entry == ANY_HOST or entry == name:
            return True
        if entry.startswith(".") and (name == entry[1:] or name.endswith(entry)):
            return True
    return False


def _origin_of(value: str) -> tuple[str, str, str] | None:
    scheme, sep, rest = value.strip().lower().partition("://")
    if not sep or not rest or "/" in rest:
        return None
    name, port = _split_host(rest)
    return scheme, name, port or _DEFAULT_PORTS.get(scheme, "")


def _media_type(headers: Headers) -> str | None:
    raw = headers.get("content-type")
    return None if raw is None else raw.split(";", 1)[0].strip().lower()


class Guard:
    """See the module docstring. `allowed_hosts` holds names (normalise_host) or `*`; `allowed_origins`
    origins such as `https://ops.example.com`, besides the request's own."""

    def __init__(self, app: ASGIApp, *, allowed_hosts: Sequence[str], allowed_origins: Sequence[str] = (),
                 max_body_bytes: int) -> None:
        self.app = app
        self.allowed_hosts = tuple(normalise_host(h) for h in allowed_hosts)
        self.any_host = ANY_HOST in self.allowed_hosts
        self.allowed_origins = {o for o in (_origin_of(x) for x in allowed_origins) if o is not None}
        self.limit = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self.refusal(scope, headers)
        if refusal is not None:
            await _answer(scope, send, refusal)
            return
        received = 0
        started = False

        async def counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise too_large(self.limit)
            return message

        try:
            await self.app(scope, limited, counted)
        except Problem as exc:  # the body's limit, raised where no handler turned it into its answer
            if started:
                raise
            await _answer(scope, send, exc)

    def refusal(self, scope: Scope, headers: Headers) -> Problem | None:
        host = headers.get("host", "")
        if not self.any_host and not host_allowed(host, self.allowed_hosts):
            name = _split_host(host)[0] or "(none)"
            return Problem(400, "HOST_NOT_ALLOWED",
                           f"Host {host or '(none)'!r} is not an allowed name of this server: allow it with "
                           f"`taskq web --allowed-host {name}` (or create_app(allowed_hosts=[...]))")
        declared = headers.get("content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > self.limit:
            return too_large(self.limit)
        if scope["method"] not in WRITE_METHODS:
            return None
        site = headers.get("sec-fetch-site")
        if site is not None and site.strip().lower() in ("cross-site", "same-site"):
            return Problem(403, "PERMISSION_DENIED", "writes sent by another site are refused (Sec-Fetch-Site)")
        origin = headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, scope, host):
            return Problem(403, "PERMISSION_DENIED",
                           f"writes from origin {origin!r} are refused: only this server's own origin and its "
                           "allowed origins may write")
        has_body = (declared is not None and declared.strip() not in ("", "0")) or "transfer-encoding" in headers
        media = _media_type(headers)
        if route_path(scope).startswith(API_PREFIX + "/"):
            if (has_body or media is not None) and media != "application/json":
                return Problem(415, "UNSUPPORTED_MEDIA_TYPE",
                               "the API reads JSON bodies only: send Content-Type: application/json")
        elif (has_body or media is not None) and media != "application/x-www-form-urlencoded":
            return Problem(415, "UNSUPPORTED_MEDIA_TYPE",
                           "dashboard forms are application/x-www-form-urlencoded (no uploads)")
        return None

    def origin_allowed(self, origin: str, scope: Scope, host: str) -> bool:
        given = _origin_of(origin)
        if given is None:  # "null" (a sandboxed or file page) and anything malformed
            return False
        if given in self.allowed_origins:
            return True
        scheme = str(scope.get("scheme", "http"))
        name, port = _split_host(host)
        return given == (scheme, name, port or _DEFAULT_PORTS.get(scheme, ""))


async def _answer(scope: Scope, send: Send, problem: Problem) -> None:
    import json

    body = json.dumps(problem.body(instance=str(scope.get("path", "")))).encode()
    scope["taskq.refused"] = problem.code
    await send({"type": "http.response.start", "status": problem.status,
                "headers": [(b"content-type", PROBLEM_TYPE.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class AccessLog:
    """One line per request to `taskq.web.access`; 401 and 403 at WARNING with the client's address. The
    principal is the name a handler put in the scope (`taskq.principal`), never a token."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access_log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500
        ensure_request_id(scope)
        root = str(scope.get("root_path", ""))  # routing appends the mount prefixes to it

        async def seen(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, seen)
        finally:
            self.write(scope, root, status, time.perf_counter() - t0)

    @staticmethod
    def write(scope: Scope, root: str, status: int, seconds: float) -> None:
        template = getattr(scope.get("route"), "path", None)
        if template is not None:
            # the route's own pattern (never the client's text), behind the prefixes of the mounts inside us
            where = str(scope.get("root_path", ""))[len(root):] + template
        else:
            where = "(unmatched)"
        who = str(scope.get("taskq.principal", "-"))
        rid = str(scope.get("taskq.request_id", "-"))
        client = scope.get("client")
        address = str(client[0]) if client else "-"
        fields: dict[str, Any] = {"principal": who, "method": scope["method"], "route": where, "status": status,
                                  "request_id": rid, "duration_ms": round(seconds * 1000, 1), "client": address}
        level = logging.WARNING if status in (401, 403) else logging.INFO
        access_log.log(level, "%s %s %s %d %s %.1fms %s", who, scope["method"], where, status, rid,
                       seconds * 1000, address, extra={"fields": fields})


async def read_form(request: Request) -> FormData:
    """A dashboard form, within bounds: no files, FORM_FIELDS fields of FORM_PART_BYTES each at most."""
    return await request.form(max_files=0, max_fields=FORM_FIELDS, max_part_size=FORM_PART_BYTES)
