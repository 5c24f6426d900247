"""Both faces of the client under one set of test cases: `as_async(SyncJobsClient)` looks like a
JobsClient to a test written for the async one (each coroutine method of the async class runs the sync
method, blocking, and returns its result), so a fixture parametrized over "async" and "sync" runs every
case against both faces."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

from taskq.actors.declaration import ActorRegistry
from taskq.backend import Backend
from taskq.backend.core_sync import SyncBackend
from taskq.client import JobHandle, JobsClient
from taskq.client_sync import SyncJobHandle, SyncJobsClient

FACES = ["async", "sync"]
_COUNTERPARTS: dict[type, type] = {SyncJobsClient: JobsClient, SyncJobHandle: JobHandle, SyncBackend: Backend}


class _AsyncView:
    """The sync object `inner` as its async counterpart's coroutine methods would show it."""

    def __init__(self, inner: Any, counterpart: type) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_counterpart", counterpart)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._inner, name)
        if inspect.iscoroutinefunction(getattr(self._counterpart, name, None)):
            method = cast(Callable[..., Any], value)

            async def call(*args: Any, **kwargs: Any) -> Any:
                return wrap(method(*args, **kwargs))

            return call
        return wrap(value)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __repr__(self) -> str:
        return repr(self._inner)


def wrap(value: Any) -> Any:
    if isinstance(value, list):
        return [wrap(v) for v in value]
    counterpart = _COUNTERPARTS.get(type(value))
    return _AsyncView(value, counterpart) if counterpart is not None else value


@asynccontextmanager
async def client_of(face: str, dsn: str, registry: ActorRegistry | None = None, **options: Any) -> AsyncIterator[
    JobsClient
]:
    """A JobsClient, or a SyncJobsClient seen through `as_async`, connected to `dsn`."""
    if face == "async":
        async with await JobsClient.connect(dsn, registry=registry, **options) as client:
            yield client
    else:
        with SyncJobsClient.connect(dsn, registry=registry, **options) as sync_client:
            yield cast(JobsClient, wrap(sync_client))
