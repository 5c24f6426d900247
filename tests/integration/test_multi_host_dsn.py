"""Multi-host DSNs (issue 33): `host=a,b,c target_session_attrs=read-write` works for every taskq connection
(client, sync client, worker and its LISTEN connection, web API pool), the first host dead or not; a DSN
whose every host refuses writes is a clear error that says what to do; nothing is written on the way."""

from __future__ import annotations

import socket
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from testkit import running_worker

from taskq import JobsClient, SyncJobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.backend.bounded import open_bounded
from taskq.exceptions import DatabaseUnavailable
from taskq.settings import WorkerSettings
from taskq.worker.main import Worker, worker_main_async

pytestmark = pytest.mark.timeout(60)


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed on return: nothing listens there


def multi_host(dsn: str, *, first_dead: bool = True, **extra: str) -> str:
    """`dsn` behind a dead first host: libpq tries 127.0.0.1:<a closed port>, then the test server."""
    params = conninfo_to_dict(dsn)
    host, port = str(params.pop("host", "localhost")), str(params.pop("port", "5432"))
    params.pop("hostaddr", None)
    hosts = f"127.0.0.1,{host}" if first_dead else host
    ports = f"{dead_port()},{port}" if first_dead else port
    return make_conninfo("", **params, host=hosts, port=ports, target_session_attrs="read-write",
                         connect_timeout="3", **extra)


def registry() -> ActorRegistry:
    reg = ActorRegistry()

    @actor(name="mh.echo", registry=reg)
    async def echo(payload: int) -> int:
        return payload

    return reg


async def test_every_connection_works_through_a_multi_host_dsn_with_a_dead_first_host(dsn: str) -> None:
    multi = multi_host(dsn)
    async with await JobsClient.connect(multi) as client, running_worker(multi, registry()):
        handle = await client.enqueue("mh.echo", 7)
        assert (await handle.wait(timeout=20)).result == 7
        with psycopg.connect(dsn, autocommit=True) as conn:  # the worker's LISTEN session is on the server
            listening = conn.execute("SELECT count(*) FROM pg_stat_activity "
                                     "WHERE application_name LIKE 'taskq-listener %%'").fetchone()
        assert listening == (1,)
    with SyncJobsClient.connect(multi) as sync_client:
        assert sync_client.enqueue("mh.echo", 8).job_id is not None
    web = await open_bounded(multi, max_size=2, statement_timeout=5, idle_in_transaction_timeout=5)
    try:
        async with web.connection() as conn:
            assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)
    finally:
        await web.close()


def read_only(dsn: str) -> str:
    """`dsn` with every session read-only, as a standby's are (libpq's read-write check refuses it)."""
    return dsn + " options='-c default_transaction_read_only=on'"


async def test_a_dsn_whose_every_host_refuses_writes_is_a_clear_error(dsn: str) -> None:
    multi = multi_host(read_only(dsn))
    with pytest.raises(DatabaseUnavailable) as caught:
        await JobsClient.connect(multi)
    text = str(caught.value)
    assert "every host failed" in text and "target_session_attrs=read-write" in text, text
    settings = WorkerSettings(dsn=multi)
    with pytest.raises(DatabaseUnavailable, match=r"needs the primary|no host of the DSN takes writes"):
        await worker_main_async(settings, registry(), handle_signals=False)


async def test_a_worker_on_a_read_only_server_without_target_session_attrs_refuses_to_start(dsn: str,
                                                                                          client: Any) -> None:
    plain = read_only(dsn)
    settings = WorkerSettings(dsn=plain)
    with pytest.raises(DatabaseUnavailable, match=r"cannot take writes.*target_session_attrs=read-write"):
        await worker_main_async(settings, registry(), worker=Worker(settings, registry()), handle_signals=False)
    # a client may read there, and its first write says why it failed, with nothing written
    async with await JobsClient.connect(plain) as reader:
        assert await reader.get("0192f000-0000-7000-8000-000000000000") is None
        with pytest.raises(DatabaseUnavailable, match="read-only"):
            await reader.enqueue("mh.echo", 1)
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM taskq.jobs").fetchone() == (0,)
