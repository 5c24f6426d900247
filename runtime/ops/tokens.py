"""API tokens and their grants (issue 20): who may do what, on which queues, through the web API and
dashboard. One service function per action (create, list, revoke, authenticate), called by
`taskq tokens` and by taskq.web; no web framework is imported here.

A grant is `ACTION@QUEUE-PATTERN`: ACTION is one of ACTIONS, `jobs:*` (every jobs action) or `*`; the
pattern matches queue names, `*` standing for any run of characters (`billing-*`, `*`). A token is 256
random bits shown once; only its SHA-256 is stored.

Create and revoke go through owner functions of the database (migrations 15 and 18: `token_create_v18`,
`token_revoke_v15`, EXECUTE for the admin role of sql/roles.sql): they check the grants, set `created_by`
to the database role that asked (`session_user`), keep `revoked_at` write-once, end a revoked token's
dashboard sessions, and write the tokens:create / tokens:revoke audit row (principal `db:<role>`) in the
same transaction. The OS user (`$USER@host`, which the environment can set to anything) goes to that
audit row only, labelled `os_user_claimed`.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from taskq.backend import Backend
from taskq.backend.web import fetch_all, fetch_one
from taskq.checks import is_utf8
from taskq.exceptions import ConfigurationError, TokenExists, TokenNotFound
from taskq.patterns import queue_matches

ACTIONS = (
    "jobs:read", "jobs:enqueue", "jobs:cancel", "jobs:requeue", "jobs:signal",
    "schedules:read", "schedules:write", "workers:read", "queues:read", "queues:write",
)
TOKEN_PREFIX = "tq_"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MAX_GRANTS = 100


@dataclass(frozen=True, slots=True)
class Grant:
    action: str
    pattern: str

    def __str__(self) -> str:
        return f"{self.action}@{self.pattern}"

    def allows(self, action: str) -> bool:
        return self.action in ("*", action) or (self.action.endswith(":*") and action.startswith(self.action[:-1]))

    def matches(self, queue: str) -> bool:
        return queue_matches(self.pattern, queue)

    def like(self) -> str:
        """The pattern as a SQL LIKE pattern (backslash escapes)."""
        escaped = self.pattern.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return escaped.replace("*", "%")


def parse_grant(text: object) -> Grant:
    """`action@pattern`, or ConfigurationError naming what is wrong."""
    if not isinstance(text, str) or "@" not in text:
        raise ConfigurationError(f"a grant is ACTION@QUEUE-PATTERN (e.g. jobs:read@*), got {text!r}")
    action, _, pattern = text.partition("@")
    known = (*ACTIONS, "*", *sorted({a.split(":")[0] + ":*" for a in ACTIONS}))
    if action not in known:
        raise ConfigurationError(f"unknown action {action!r} in grant {text!r}; actions: {', '.join(known)}")
    if not pattern or len(pattern) > 255 or "\x00" in pattern or not is_utf8(pattern):
        raise ConfigurationError(f"the queue pattern of grant {text!r} must be 1-255 characters without NUL")
    return Grant(action, pattern)


@dataclass(frozen=True, slots=True)
class Principal:
    """Who makes a request: a token's name and its grants (`anonymous` with every grant when the server
    runs without auth, on loopback only)."""

    name: str
    grants: tuple[Grant, ...]

    def may(self, action: str, queue: str | None = None) -> bool:
        """Some grant covers `action` on `queue` (on any queue, when `queue` is None)."""
        return any(g.allows(action) and (queue is None or g.matches(queue)) for g in self.grants)

    def readable(self, action: str = "jobs:read") -> list[str] | None:
        """LIKE patterns of the queues `action` covers; None when it covers every queue."""
        patterns = [g for g in self.grants if g.allows(action)]
        if any(g.pattern == "*" for g in patterns):
            return None
        return [g.like() for g in patterns]


ANONYMOUS = Principal("anonymous", (Grant("*", "*"),))


class TokenInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    grants: tuple[str, ...]
    created_at: datetime
    created_by: str | None
    last_used_at: datetime | None
    revoked_at: datetime | None


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def check_token_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigurationError(
            f"a token name is 1-100 letters, digits, '.', '_' or '-' (starting with a letter or digit), got {name!r}"
        )
    return name


def os_user_claimed() -> str:
    """What the environment says the OS user is (`$LOGNAME`/`$USER`@host): a hint for the audit row, never
    an identity (created_by and the audit's principal come from the database)."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "unknown"
    return f"{user}@{os.uname().nodename}"[:200]


async def create_token(backend: Backend, name: str, grants: list[str]) -> tuple[TokenInfo, str]:
    """A new token NAME with `grants`; returns its info and the token itself (shown once, never stored)."""
    name = check_token_name(name)
    if not grants:
        raise ConfigurationError("a token needs at least one --grant (e.g. jobs:read@*)")
    if len(grants) > MAX_GRANTS:
        raise ConfigurationError(f"at most {MAX_GRANTS} grants per token")
    parsed = [str(parse_grant(g)) for g in grants]
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    params = {"name": name, "token_hash": hash_token(raw), "grants": parsed, "os_user": os_user_claimed()}
    row = await fetch_one(backend, "token_insert", params)
    if row is None:
        raise TokenExists(f"a token named {name!r} exists already (revoked tokens keep their name)")
    return TokenInfo.model_validate(row), raw


async def list_tokens(backend: Backend) -> list[TokenInfo]:
    return [TokenInfo.model_validate(r) for r in await fetch_all(backend, "token_list")]


async def revoke_token(backend: Backend, name: str) -> bool:
    """Revoke NAME at once; False if it already was. TokenNotFound for an unknown name."""
    row = await fetch_one(backend, "token_revoke", {"name": check_token_name(name), "os_user": os_user_claimed()})
    if row is None:
        raise TokenNotFound(f"no token named {name!r}")
    return bool(row["changed"])


async def authenticate(backend: Backend, raw: str) -> Principal | None:
    """The principal of a live token, or None (unknown, revoked, or not a token at all)."""
    if not raw.startswith(TOKEN_PREFIX) or len(raw) > 200 or not raw.isascii():
        return None
    row = await fetch_one(backend, "token_lookup", {"token_hash": hash_token(raw)})
    if row is None:
        return None
    return Principal(row["name"], tuple(parse_grant(g) for g in row["grants"]))

