"""What one web app holds: its settings, its Backend (opened on first use, so the app also works when
mounted in a host application that does not run its lifespan), the token cache and the stats cache."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend
from taskq.dsn import resolve_dsn
from taskq.ops.tokens import ANONYMOUS, Principal, authenticate, hash_token
from taskq.web import sessions

TOKEN_CACHE_SECONDS = 5.0
"""A revoked token stops working within this long (each web process re-reads a token at most this often)."""
STATS_CACHE_SECONDS = 2.0
"""The overview's aggregates are computed at most this often per web process, however many viewers."""
RECENT_CACHE_SECONDS = 15.0
"""The last hour's per-minute outcomes and run times (the overview's charts) are computed at most this
often per web process: unlike the depth (index entries of waiting and running rows), that query reads
every job finished in the last hour, so its cost grows with the throughput (benchmarks/web.py)."""


@dataclass
class WebConfig:
    """`auth` False serves everyone as `anonymous` with every grant: only on loopback (taskq web refuses
    another host). `cancellation_grace_period` and `cleanup_grace_period`: the fleet's (for the cancel
    ladder's time-left clocks; the settings' defaults and TASKQ_* env when None).

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


@dataclass
class WebState:
    config: WebConfig
    backend_given: Backend | None = None
    _backend: Backend | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _tokens: dict[str, tuple[float, Principal | None]] = field(default_factory=dict)
    _stats: dict[str, tuple[float, Any]] = field(default_factory=dict)
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    async def backend(self) -> Backend:
        if self.backend_given is not None:
            return self.backend_given
        if self._backend is None:
            async with self._lock:
                if self._backend is None:
                    self._backend = await Backend.open(resolve_dsn(self.config.dsn), min_size=1, max_size=4)
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
            return hit[1]
        found = await authenticate(await self.backend(), raw)
        if len(self._tokens) > 1000:
            self._tokens.clear()
        self._tokens[key] = (now + TOKEN_CACHE_SECONDS, found)
        return found

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
