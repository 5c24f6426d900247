"""The listener: a dedicated LISTEN connection that reconnects by itself and hands each notification to
the callback its channel routes to. It wakes the dispatcher on NOTIFY and delivers cancel requests in
milliseconds; polling every `poll_interval` (and the heartbeat, for cancels) is the fallback, and the
only way new work is found while the connection is down.

A LISTEN connection can stop delivering without an error: its peer vanished (a partition, a host that
died: the socket stays open until TCP gives up), or, after a failover, it reached a server that is now a
standby, which hears nothing of the new primary's commits. So the connection carries TCP keepalives and a
user timeout (taskq.backend._conn.TCP_KEEPALIVES), and every PROBE_INTERVAL seconds without a notification
it asks its server whether it is still a primary and the session still listens. A failed or late probe,
or a standby, closes it; the next connection goes wherever the DSN leads (`target_session_attrs=read-write`
finds the new primary among several hosts). Its age and reconnections are metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

import psycopg

from taskq.backend.notify import ListenerUnfit, open_listener, probe_listener
from taskq.metrics import LISTENER_CONNECTED_AT, LISTENER_RECONNECTS

log = logging.getLogger("taskq.dispatcher")

Route = Callable[[str], None]
"""What a channel's notification is handed to: its payload."""

PROBE_INTERVAL = 5.0
"""Seconds without a notification after which the LISTEN connection checks itself."""
PROBE_TIMEOUT = 10.0
"""Seconds the probe (and a connection attempt) may take before the connection counts as dead."""
RECONNECT_BACKOFF_MAX = 2.0
"""The longest wait between two connection attempts: after a failover, every worker listens on the new
primary within this of it taking connections."""


class Listener:
    """`routes` maps each channel to the callback for its payloads; `on_connect()` runs at each
    (re)connection, for whatever was missed while the connection was down."""

    def __init__(self, dsn: str, routes: Mapping[str, Route], *, on_connect: Callable[[], None],
                 probe_interval: float = PROBE_INTERVAL, probe_timeout: float = PROBE_TIMEOUT,
                 worker_id: str | None = None) -> None:
        self.dsn = dsn
        self.worker_id = worker_id
        self._routes = dict(routes)
        self._on_connect = on_connect
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.connected = asyncio.Event()
        self.reconnects = 0
        """Connections given up after one was up (each is counted in taskq_listener_reconnects)."""
        self.connected_since: float | None = None
        """time.monotonic() when the current connection opened; None while there is none."""

    async def run(self) -> None:
        backoff = 0.1
        down_since: float | None = None  # monotonic; the first failure of the current outage
        failures = 0
        while True:
            try:
                conn = await open_listener(self.dsn, connect_timeout=self.probe_timeout, worker_id=self.worker_id)
            except (psycopg.Error, OSError, ListenerUnfit) as exc:
                failures += 1
                if down_since is None:
                    down_since = time.monotonic()
                # one line per outage at warning level, not one per attempt (a standby answers every few
                # hundred milliseconds with the same refusal)
                (log.warning if failures == 1 else log.debug)(
                    "cannot open the LISTEN connection (%s); polling every poll_interval meanwhile, retrying "
                    "every %.1fs at most", _first_line(exc), RECONNECT_BACKOFF_MAX)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, RECONNECT_BACKOFF_MAX)
                continue
            if down_since is not None:
                log.warning("LISTEN connection open again after %.1fs (%d attempts)",
                            time.monotonic() - down_since, failures)
            backoff, down_since, failures = 0.1, None, 0
            reason = "lost"
            try:
                async with conn:
                    self.connected_since = time.monotonic()
                    LISTENER_CONNECTED_AT.set(time.time())
                    self.connected.set()
                    self._on_connect()
                    reason = await self._serve(conn)
            except (psycopg.Error, OSError) as exc:
                log.warning("LISTEN connection lost (%s); reconnecting", _first_line(exc))
            finally:
                self.connected.clear()
                self.connected_since = None
                LISTENER_CONNECTED_AT.set(0)
            self.reconnects += 1
            LISTENER_RECONNECTS.labels(reason=reason).inc()
            down_since = time.monotonic()

    async def _serve(self, conn: psycopg.AsyncConnection[object]) -> str:
        """Hand notifications to their routes and probe the connection whenever `probe_interval` passes
        without one; returns why the connection is given up (a broken connection raises)."""
        while True:
            async for note in conn.notifies(timeout=self.probe_interval):
                route = self._routes.get(note.channel)
                if route is not None:
                    route(note.payload)
            try:
                await asyncio.wait_for(probe_listener(conn), self.probe_timeout)
            except TimeoutError:
                log.warning("LISTEN connection did not answer its probe within %.0fs; reconnecting",
                            self.probe_timeout)
                return "probe_timeout"
            except ListenerUnfit as exc:
                log.warning("LISTEN connection unfit: %s; reconnecting", exc)
                return "standby" if "standby" in str(exc) else "not_listening"

    def stop(self) -> None:
        """Nothing to stop: cancel requests keep arriving while the shutdown phases play out."""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def cancel_route(worker_id: str, deliver: Callable[[UUID, int, int], None]) -> Route:
    """The route of the cancel channel: a payload `job_id:attempt:epoch:worker_id` for this worker goes to
    `deliver(job_id, attempt, epoch)`; others are not ours."""

    def route(payload: str) -> None:
        try:
            job_id, attempt, epoch, target = payload.split(":", 3)
            if target != worker_id:
                return
            deliver(UUID(job_id), int(attempt), int(epoch))
        except ValueError:
            log.warning("ignoring malformed cancel notification %r", payload)

    return route


def queue_route(queues: Sequence[str], *callbacks: Callable[[], None], any_queue: str | None = None) -> Route:
    """A route that runs `callbacks` for a payload naming one of `queues` (or `any_queue`)."""
    names = set(queues)

    def route(payload: str) -> None:
        if payload in names or (any_queue is not None and payload == any_queue):
            for callback in callbacks:
                callback()

    return route


def wake_route(*callbacks: Callable[[], None]) -> Route:
    """A route that runs `callbacks` whatever the payload."""

    def route(payload: str) -> None:
        for callback in callbacks:
            callback()

    return route
