"""The worker's services as a set (taskq.worker.service): the first to end stops the worker, the last one
is cancelled after the others, a service that loses a cancel is cancelled again. No database."""

from __future__ import annotations

import asyncio

import pytest

from taskq.worker.service import ServiceSet, cancel_and_wait

pytestmark = pytest.mark.timeout(10)


class Idle:
    def __init__(self, log: list[str], name: str) -> None:
        self.log = log
        self.name = name
        self.stopped = False

    async def run(self) -> None:
        try:
            await asyncio.Event().wait()
        finally:
            self.log.append(f"{self.name} ended")

    def stop(self) -> None:
        self.stopped = True


class Crashing(Idle):
    async def run(self) -> None:
        raise RuntimeError("boom")


class Returning(Idle):
    async def run(self) -> None:
        return None


class LosesOneCancel(Idle):
    async def run(self) -> None:
        lost = False
        while True:
            try:
                await asyncio.sleep(0.01)
            except asyncio.CancelledError:
                if lost:
                    self.log.append(f"{self.name} ended")
                    raise
                lost = True  # what asyncio.wait_for does on 3.11 when its inner wait completes with the cancel


async def never() -> None:
    await asyncio.Event().wait()


async def test_a_crashing_service_ends_the_wait_and_is_reported_by_name() -> None:
    log: list[str] = []
    services = ServiceSet({"completer": Idle(log, "completer"), "sweeper": Crashing(log, "sweeper")},
                          last="completer")
    services.start()
    stop = asyncio.get_running_loop().create_task(never())
    crashed = await services.wait_first(stop)
    assert [(name, str(exc)) for name, exc in crashed] == [("sweeper", "boom")]
    await cancel_and_wait([*services.cancel_others(), stop])
    await services.cancel_last()


async def test_a_service_that_returns_ends_the_wait_without_a_crash() -> None:
    services = ServiceSet({"completer": Idle([], "completer"), "pruner": Returning([], "pruner")},
                          last="completer")
    services.start()
    stop = asyncio.get_running_loop().create_task(never())
    assert await services.wait_first(stop) == []
    assert not stop.done()
    await cancel_and_wait([*services.cancel_others(), stop])
    await services.cancel_last()


async def test_the_stop_event_ends_the_wait_and_stop_reaches_every_service() -> None:
    parts = {"completer": Idle([], "completer"), "dispatcher": Idle([], "dispatcher")}
    services = ServiceSet(parts, last="completer")
    services.start()
    event = asyncio.Event()
    stop = asyncio.get_running_loop().create_task(event.wait())
    event.set()
    assert await services.wait_first(stop) == []
    services.stop()
    assert all(p.stopped for p in parts.values())
    await cancel_and_wait(services.cancel_others())
    await services.cancel_last()


async def test_the_last_service_is_cancelled_after_the_others() -> None:
    log: list[str] = []
    services = ServiceSet({"completer": Idle(log, "completer"), "heartbeat": Idle(log, "heartbeat"),
                           "sweeper": Idle(log, "sweeper")}, last="completer")
    services.start()
    await asyncio.sleep(0)
    others = services.cancel_others()
    await cancel_and_wait(others)
    assert sorted(log) == ["heartbeat ended", "sweeper ended"]
    await services.cancel_last()
    assert log[-1] == "completer ended"


async def test_a_service_that_loses_its_cancel_is_cancelled_again() -> None:
    log: list[str] = []
    services = ServiceSet({"completer": Idle(log, "completer"), "sweeper": LosesOneCancel(log, "sweeper")},
                          last="completer")
    services.start()
    await asyncio.sleep(0.02)
    await asyncio.wait_for(cancel_and_wait(services.cancel_others()), 5)
    await services.cancel_last()
    assert log == ["sweeper ended", "completer ended"]
