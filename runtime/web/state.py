"""What one web app holds: its settings, its Backend (opened on first use, so the app also works when
mounted in a host application that does not run its lifespan), the token cache and the stats cache."""

from __future__ import annotations

import asyncio
import math
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend, transaction_pooler_from_env
from taskq.backend.bounded import open_bounded
from taskq.dsn import resolve_dsn
from taskq.exceptions import ConfigurationError
from taskq.ops.tokens import ANONYMOUS, Principal, authenticate, hash_token
from taskq.web import sessions
from taskq.web.guard import DEFAULT_ALLOWED_HOSTS

TOKEN_CACHE_SECONDS = 5.0
"""A revoked token stops working within this long (each web process re-reads a token at most this often)."""
STATS_CACHE_SECONDS = 2.0
"""The overview's aggregates are computed at most this often per web process, however many viewers."""
RECENT_CACHE_SECONDS = 15.0
"""The last hour's per-minute outcomes and run times (the overview's charts) are computed at most this
often per web process: unlike the depth (index entries of waiting and running rows), that query reads
every job finished in the last hour, so its cost grows with the throughput (benchmarks/web.py)."""
TOKEN_CACHE_SIZE = 1000
"""Principals of known tokens kept per web process (least recently used first out)."""
MISS_CACHE_SIZE = 256
"""Unknown or revoked tokens remembered as such, in a cache of their own: a flood of made-up tokens
costs one lookup each and evicts only other misses, never a real token's principal."""
DEFAULT_POOL_SIZE = 8
"""Database connections per web process. Every statement is bounded by the statement timeout, so a few
slow list queries at once still leave connections for the token lookups and the dashboard's polls."""
DEFAULT_STATEMENT_TIMEOUT = 5.0
DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT = 10.0


@dataclass
class WebConfig:
    """`auth` False serves everyone as `anonymous` with every grant: only on loopback (taskq web refuses
    another host). `cancellation_grace_period` and `cleanup_grace_period`: the fleet's (for the cancel
    ladder's time-left clocks; the settings' defaults and TASKQ_* env when None).

    `allowed_hosts`: the names the app answers to in `Host` (any port; `.example.com` also its
    subdomains; `*` no check, for a reverse proxy that checks Host itself). `allowed_origins`: origins
    (`https://ops.example.com`) whose pages may write, besides the app's own. `pool_size`: database
    connections; `statement_timeout` and `idle_in_transaction_timeout` (seconds) bound each of them.

    Dashboard sessions: `session_idle_seconds` without a request ends one (8 h), `session_max_seconds` ends
    it whatever its use (24 h, also the cookie's Max-Age). `secure_cookies`: None marks the session cookie
    `Secure` unless the request came to a loopback address of the server over plain HTTP (behind a TLS
    proxy on the same host, say True); True or False forces it."""

    dsn: str | None = None
    auth: bool = True
    registry: ActorRegistry | None = None
    cancellation_grace_period: float | None = None
    cleanup_grace_period: float | None = None
    poll_seconds: float = 2.0
    max_body_bytes: int = 1_048_576
    secure_cookies: bool | None = None
    session_idle_seconds: float = 8 * 3600.0
    session_max_seconds: float = 24 * 3600.0
    allowed_hosts: tuple[str, ...] = DEFAULT_ALLOWED_HOSTS
    allowed_origins: tuple[str, ...] = ()
    pool_size: int = DEFAULT_POOL_SIZE
    statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT
    idle_in_transaction_timeout: float = DEFAULT_IDLE_IN_TRANSACTION_TIMEOUT

    def __post_init__(self) -> None:
        for name in ("statement_timeout", "idle_in_transaction_timeout", "poll_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ConfigurationError(f"WebConfig.{name} must be a positive number of seconds, got {value!r}")
        for name in ("pool_size", "max_body_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"WebConfig.{name} must be a positive integer, got {value!r}")
        for name in ("allowed_hosts", "allowed_origins"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) and v.strip() for v in value):
                raise ConfigurationError(f"WebConfig.{name} must be a list of names, got {value!r}")
            setattr(self, name, tuple(value))


@dataclass
class WebState:
    config: WebConfig
    backend_given: Backend | None = None
    _backend: Backend | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tokens: OrderedDict[str, tuple[float, Principal]] = field(default_factory=OrderedDict)
    _misses: OrderedDict[str, float] = field(default_factory=OrderedDict)
    _stats: dict[str, tuple[float, Any]] = field(default_factory=dict)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    async def backend(self) -> Backend:
        if self.backend_given is not None:
            return self.backend_given
        if self._backend is None:
            async with self._lock:
                if self._backend is None:
                    cfg = self.config
                    self._backend = await open_bounded(
                        resolve_dsn(cfg.dsn), max_size=cfg.pool_size, statement_timeout=cfg.statement_timeout,
                        idle_in_transaction_timeout=cfg.idle_in_transaction_timeout,
                        transaction_pooler=transaction_pooler_from_env())
        return self._backend

    async def close(self) -> None:
        if self._backend is not None:
            await self._backend.close()
            self._backend = None

    async def principal(self, raw: str | None) -> Principal | None:
        """The principal of a bearer token or session cookie (None: no or bad token), cached briefly."""
        if not self.config.auth:
            return ANONYMOUS
        if not raw:
            return None
        key = hash_token(raw)
        now = time.monotonic()
        hit = self._tokens.get(key)
        if hit is not None and hit[0] > now:
            self._tokens.move_to_end(key)
            return hit[1]
        missed = self._misses.get(key)
        if missed is not None and missed > now:
            return None
        found = await authenticate(await self.backend(), raw)
        if found is None:
            self._tokens.pop(key, None)
            _put(self._misses, key, now + TOKEN_CACHE_SECONDS, MISS_CACHE_SIZE)
        else:
            self._misses.pop(key, None)
            _put(self._tokens, key, (now + TOKEN_CACHE_SECONDS, found), TOKEN_CACHE_SIZE)
        return found

    def forget_principal(self, name: str) -> None:
        """Drop the cached principal of token `name` (the database found it revoked before the cache did)."""
        for key in [k for k, (_, who) in self._tokens.items() if who.name == name]:
            del self._tokens[key]

    def cached_principals(self) -> int:
        """How many principals of real tokens the cache holds (for tests and diagnostics)."""
        return len(self._tokens)

    async def session(self, session_id: str | None) -> sessions.Session | None:
        """The live dashboard session of a cookie's id (read from the database on every call: a logout,
        an expiry or a revocation holds at once in every process); None without auth or without one."""
        if not self.config.auth or not session_id:
            return None
        return await sessions.resolve(await self.backend(), session_id, idle_seconds=self.config.session_idle_seconds)

    def cached(self, key: str) -> Any:
        hit = self._stats.get(key)
        return hit[1] if hit is not None and hit[0] > time.monotonic() else None

    def forget(self) -> None:
        """Drop the cached stats (after a write that changes them, such as a queue's pause)."""
        self._stats.clear()

    def remember(self, key: str, value: Any, seconds: float = STATS_CACHE_SECONDS) -> Any:
        if len(self._stats) > 1000:
            self._stats.clear()
        self._stats[key] = (time.monotonic() + seconds, value)
        return value


def _put(cache: OrderedDict[str, Any], key: str, value: Any, size: int) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > size:
        cache.popitem(last=False)
