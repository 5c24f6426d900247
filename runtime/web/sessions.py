"""Dashboard sessions (taskq.web_sessions): a login with an API token opens one, and the cookie holds only
the session's random id; the table keeps its SHA-256, the token's name, a CSRF secret of its own, and an
idle and an absolute expiry. Every page resolves the session again (no cache), so a logout, an expiry or the
token's revocation ends it at once in every web process; the CSRF token of its forms is an HMAC under the
session's own secret, so it holds across processes and restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from taskq.backend import Backend
from taskq.backend.web import fetch_all, fetch_one
from taskq.ops.tokens import Principal, parse_grant

__all__ = ["PRUNE_BATCH", "Session", "create", "csrf_token", "end", "prune", "resolve"]

PRUNE_BATCH = 100
"""At most this many unusable sessions (ended or expired) are deleted at each login."""
_ID_BYTES = 32


@dataclass(frozen=True, slots=True)
class Session:
    """A live session: its id's hash, the principal of its token, and its CSRF secret."""

    id_hash: str
    principal: Principal
    csrf_secret: str


def hash_id(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


def csrf_token(session: Session) -> str:
    """The token a form of this session carries: an HMAC of the session under its own secret."""
    return hmac.new(session.csrf_secret.encode(), session.id_hash.encode(), hashlib.sha256).hexdigest()[:40]


async def create(backend: Backend, principal: Principal, *, idle_seconds: float, absolute_seconds: float
                 ) -> tuple[str, Session]:
    """Open a session for `principal` (a live token): the session id for the cookie (never stored), and the session."""
    session_id = secrets.token_urlsafe(_ID_BYTES)
    idle = min(idle_seconds, absolute_seconds)
    row = await fetch_one(backend, "session_create", {
        "id_hash": hash_id(session_id), "token_name": principal.name, "csrf_secret": secrets.token_hex(32),
        "idle": idle, "absolute": absolute_seconds,
    })
    assert row is not None
    return session_id, Session(row["id_hash"], principal, row["csrf_secret"])


async def resolve(backend: Backend, session_id: str, *, idle_seconds: float) -> Session | None:
    """The live session of a cookie's id, its idle expiry moved forward; None once it is ended, idle too long,
    past its absolute limit, or its token revoked (or for anything that is not a session id)."""
    if not session_id or len(session_id) > 100 or not session_id.isascii():
        return None
    row = await fetch_one(backend, "session_resolve", {
        "id_hash": hash_id(session_id), "idle": idle_seconds, "touch_after": min(60.0, idle_seconds / 10),
    })
    if row is None:
        return None
    principal = Principal(row["token_name"], tuple(parse_grant(g) for g in row["grants"]))
    return Session(hash_id(session_id), principal, row["csrf_secret"])


async def end(backend: Backend, session_id: str) -> bool:
    """End a session (logout): its id is refused from now on, in every process. False if it was not live."""
    if not session_id or len(session_id) > 100 or not session_id.isascii():
        return False
    return await fetch_one(backend, "session_end", {"id_hash": hash_id(session_id)}) is not None


async def prune(backend: Backend, limit: int = PRUNE_BATCH) -> None:
    """Delete at most `limit` sessions that can no longer be used."""
    await fetch_all(backend, "session_prune", {"limit": limit})
