"""Helpers shared by the tests: an in-process worker, and waiting on conditions with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg

from taskq.settings import WorkerSettings
from taskq.worker.main import Worker, worker_main_async

FAST_WINDOWS: dict[str, Any] = {
    "heartbeat_interval": 0.1,
    "lock_timeout": 1.0,
    "poll_interval": 0.1,
    "sweep_interval": 0.2,
    "cancellation_grace_period": 0.3,
    "cleanup_grace_period": 0.3,
    "shutdown_timeout": 10.0,
}


PASSWORD_ROLE_PREFIX = "taskq_pw_"
"""Roles named so must log in with their password on the embedded test server, which trusts everyone
else: the tests of a wrong password need a server that checks one."""


@contextlib.asynccontextmanager
async def running_worker(dsn: str, actors: Any, **overrides: Any) -> AsyncIterator[Worker]:
    """An in-process worker on this test's event loop, with sub-second windows; stopped on exit."""
    settings = WorkerSettings(dsn=dsn, **(FAST_WINDOWS | overrides))
    worker = Worker(settings, actors)
    task = asyncio.get_running_loop().create_task(
        worker_main_async(settings, actors, worker=worker, handle_signals=False)
    )
    deadline = asyncio.get_running_loop().time() + 10
    while not worker.ready.is_set():
        if task.done():
            task.result()
        assert asyncio.get_running_loop().time() < deadline, "worker did not start"
        await asyncio.sleep(0.01)
    try:
        yield worker
    finally:
        worker.request_shutdown()
        await asyncio.wait_for(task, 20)


async def wait_for(predicate: Any, timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll an (async or sync) predicate until it returns something truthy, or fail after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def wait_until(predicate: Any, timeout: float = 15.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
