"""The worker's services share one protocol, `Service` (run, stop), and run as one `ServiceSet`: each in a
task of its own, the first to end (a crash, or a return) stopping the worker, all of them cancelled on
the way out with the `last` one (the completer) after the others.

Why not asyncio.TaskGroup (DESIGN §4 names one): its rules are not the stop the worker needs. On a
child's failure a TaskGroup cancels every sibling and the parent at once, but the shutdown phases run
while the heartbeat (every lease must stay valid) and the completer (the outcomes being written) keep
going, and the completer must stop after the others. On the way out it cancels each child once and waits
without a deadline, where `cancel_and_wait` cancels again whatever lost its cancel (Python 3.11's
asyncio.wait_for can swallow one); and an error in its body reaches the caller as an ExceptionGroup.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Protocol


class Service(Protocol):
    """One background duty of the worker (model: River's maintenance services)."""

    async def run(self) -> None:
        """Do the duty until cancelled; returning (or raising) stops the worker."""

    def stop(self) -> None:
        """The worker is stopping (the DRAINING phase): take no new work. The services the stop itself
        needs (heartbeat, completer, listener) keep running; every service is cancelled at the exit."""


class ServiceSet:
    """`services` by name, started in that order; `last` is cancelled after the others."""

    def __init__(self, services: Mapping[str, Service], *, last: str) -> None:
        assert last in services, last
        self.services = dict(services)
        self._last = last
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for name, service in self.services.items():
            self._tasks[name] = loop.create_task(service.run(), name=f"taskq-{name}")

    async def wait_first(self, stop: asyncio.Task[Any]) -> list[tuple[str, BaseException]]:
        """Until `stop` ends or any service does; returns the services that crashed by then."""
        done, _ = await asyncio.wait([stop, *self._tasks.values()], return_when=asyncio.FIRST_COMPLETED)
        crashed: list[tuple[str, BaseException]] = []
        for name, task in self._tasks.items():
            if task in done and not task.cancelled():
                exc = task.exception()
                if exc:
                    crashed.append((name, exc))
        return crashed

    def stop(self) -> None:
        for service in self.services.values():
            service.stop()

    def cancel_others(self) -> list[asyncio.Task[None]]:
        """Cancel every service but the last; returns their tasks (to settle and wait for)."""
        others = [task for name, task in self._tasks.items() if name != self._last]
        for task in others:
            task.cancel()
        return others

    async def cancel_last(self) -> None:
        task = self._tasks[self._last]
        await cancel_and_wait([task])
        await asyncio.gather(task, return_exceptions=True)


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel `tasks` and wait until they end, cancelling again whichever lost the cancel. On Python
    3.11 a cancel that lands just as asyncio.wait_for's inner wait completes is lost, and psycopg_pool
    waits for a pooled connection that way: a service loop cancelled while the pool hands it a connection
    would run on, and the worker would never finish stopping (its watchdog ends it with exit 13)."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)


async def settle(tasks: Iterable[asyncio.Task[Any]], budget: float) -> None:
    """Give `tasks` `budget` seconds to end, then cancel the rest, twice if need be: a second cancel
    interrupts psycopg's own wait to cancel a query on a server that does not answer (a hung server,
    a network partition), which closes that connection instead of waiting seconds for a reply."""
    pending = {t for t in tasks if not t.done()}
    for _ in range(3):
        if not pending:
            return
        _, pending = await asyncio.wait(pending, timeout=budget)
        for task in pending:
            task.cancel()
