"""The listener: a dedicated LISTEN connection that reconnects by itself and hands each notification to
the callback its channel routes to. It wakes the dispatcher on NOTIFY and delivers cancel requests in
milliseconds; polling every `poll_interval` (and the heartbeat, for cancels) is the fallback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

import psycopg

from taskq.backend.notify import open_listener

log = logging.getLogger("taskq.dispatcher")

Route = Callable[[str], None]
"""What a channel's notification is handed to: its payload."""


class Listener:
    """`routes` maps each channel to the callback for its payloads; `on_connect()` runs at each
    (re)connection, for whatever was missed while the connection was down."""

    def __init__(self, dsn: str, routes: Mapping[str, Route], *, on_connect: Callable[[], None]) -> None:
        self.dsn = dsn
        self._routes = dict(routes)
        self._on_connect = on_connect
        self.connected = asyncio.Event()

    async def run(self) -> None:
        backoff = 0.1
        while True:
            try:
                conn = await open_listener(self.dsn)
                async with conn:
                    self.connected.set()
                    backoff = 0.1
                    self._on_connect()
                    async for note in conn.notifies():
                        route = self._routes.get(note.channel)
                        if route is not None:
                            route(note.payload)
            except (psycopg.Error, OSError) as exc:
                self.connected.clear()
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    def stop(self) -> None:
        """Nothing to stop: cancel requests keep arriving while the shutdown phases play out."""


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
