"""What a failover does to taskq's connections (issue 33), on one real server:

- a LISTEN connection whose peer stops answering (a partition, a host gone without a reset) is found out by
  its probe and replaced, and notifications flow again; its socket carries TCP keepalives and a user timeout;
- a pooled connection whose server can no longer take writes (a standby, a demoted primary: SQLSTATE 25006)
  is discarded, never served again.

The frozen peer is a real TCP proxy in front of the test server that stops forwarding without closing
anything, which is what a partition looks like from the client. A whole failover is in tests/ha/."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from testkit import wait_for

from taskq import JobsClient, SyncJobsClient
from taskq.backend._conn import TCP_KEEPALIVES, is_connection_lost
from taskq.backend.notify import LISTEN_CHANNELS
from taskq.exceptions import DatabaseUnavailable
from taskq.worker.listener import Listener

pytestmark = pytest.mark.timeout(60)


class FreezableProxy:
    """TCP on 127.0.0.1 to the test server (its Unix socket or TCP address). `freeze()` stops forwarding
    on the connections open now, leaving them open, as a partition does; new connections are forwarded."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.host = str(params.get("host") or "localhost")
        self.port = int(params.get("port") or 5432)
        self.frozen: list[asyncio.Event] = []
        self.server: asyncio.Server | None = None
        self.listen_port = 0

    async def __aenter__(self) -> FreezableProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for event in self.frozen:
            event.set()

    def dsn(self, dsn: str) -> str:
        params = {k: v for k, v in conninfo_to_dict(dsn).items() if k not in ("host", "port", "hostaddr")}
        return make_conninfo("", **params, host="127.0.0.1", port=str(self.listen_port))

    def freeze(self) -> None:
        for event in self.frozen:
            event.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.host.startswith("/"):
            up_reader, up_writer = await asyncio.open_unix_connection(f"{self.host}/.s.PGSQL.{self.port}")
        else:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        frozen = asyncio.Event()
        self.frozen.append(frozen)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while not frozen.is_set():
                    read = asyncio.ensure_future(src.read(65536))
                    stop = asyncio.ensure_future(frozen.wait())
                    await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
                    if frozen.is_set():
                        read.cancel()
                        break
                    stop.cancel()
                    data = read.result()
                    if not data:
                        dst.close()
                        return
                    dst.write(data)
                    await dst.drain()
            await asyncio.Event().wait()  # frozen: hold both sockets open, forward nothing, never close

        tasks = [asyncio.ensure_future(pipe(reader, up_writer)), asyncio.ensure_future(pipe(up_reader, writer))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            writer.close()
            up_writer.close()


@contextlib.asynccontextmanager
async def running_listener(listener: Listener) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.get_running_loop().create_task(listener.run())
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_listen_connection_whose_peer_froze_is_replaced_and_hears_again(dsn: str) -> None:
    heard: list[str] = []
    async with FreezableProxy(dsn) as proxy:
        listener = Listener(proxy.dsn(dsn), {"taskq_jobs": heard.append}, on_connect=lambda: None,
                            probe_interval=0.3, probe_timeout=1.0)
        async with running_listener(listener):
            await wait_for(listener.connected.is_set, timeout=10)
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                await conn.execute("NOTIFY taskq_jobs, 'before'")
                await wait_for(lambda: "before" in heard, timeout=5)
                proxy.freeze()  # the peer is gone without a word: no error reaches the listener
                await conn.execute("NOTIFY taskq_jobs, 'lost'")  # sent into the partition: never heard

                async def listening_again() -> bool:
                    return listener.reconnects >= 1 and listener.connected.is_set()

                await wait_for(listening_again, timeout=10)
                await conn.execute("NOTIFY taskq_jobs, 'after'")
                await wait_for(lambda: "after" in heard, timeout=5)
    assert "lost" not in heard


async def test_the_listen_connection_has_tcp_keepalives_and_a_user_timeout(dsn: str) -> None:
    async with FreezableProxy(dsn) as proxy:
        listener = Listener(proxy.dsn(dsn), {}, on_connect=lambda: None)
        from taskq.backend.notify import open_listener

        conn = await open_listener(listener.dsn)
        async with conn:
            sock = socket.socket(fileno=conn.pgconn.socket)
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == TCP_KEEPALIVES["keepalives_idle"]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == TCP_KEEPALIVES["keepalives_count"]
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == \
                    TCP_KEEPALIVES["tcp_user_timeout"]
            finally:
                sock.detach()  # the connection's socket: not ours to close
            cur = await conn.execute("SELECT pg_listening_channels()")
            assert {r[0] for r in await cur.fetchall()} == LISTEN_CHANNELS
        # a DSN's own setting wins
        conn = await open_listener(listener.dsn + " keepalives_idle=42")
        async with conn:
            sock = socket.socket(fileno=conn.pgconn.socket)
            try:
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 42
            finally:
                sock.detach()


async def make_read_only(conn: Any) -> None:
    """The server at the other end of `conn` can no longer take writes, as a demoted primary cannot (the
    session setting is reported to the client as a standby's in_hot_standby is)."""
    await conn.execute("SET default_transaction_read_only = on")


async def test_a_pooled_connection_turned_read_only_is_discarded(dsn: str) -> None:
    async with await JobsClient.connect(dsn, min_size=1, max_size=1) as client:
        pool = client.backend.pool
        async with pool.connection() as conn:
            before = conn.info.backend_pid
            await make_read_only(conn)
            with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as caught:
                await conn.execute("CREATE TEMP TABLE t (x int)")
            assert is_connection_lost(caught.value)  # the worker's retry loops take it as an outage
        # the one connection of the pool went back read-only: it is closed, and the next one works
        handle = await client.enqueue("x.anything", 1)
        assert handle.job_id is not None
        async with pool.connection() as conn:
            assert conn.info.backend_pid != before
            assert conn.info.parameter_status("default_transaction_read_only") == "off"


async def test_an_enqueue_on_a_read_only_server_is_an_outage_and_the_next_one_works(dsn: str) -> None:
    async with await JobsClient.connect(dsn, min_size=1, max_size=1) as client:
        # the server turns read-only under a connection that is out of the pool, in use
        conn = await client.backend.pool.getconn()
        await make_read_only(conn)
        cur = conn.cursor()
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            await cur.execute("INSERT INTO taskq.jobs (id) VALUES (gen_random_uuid())")
        await client.backend.pool.putconn(conn)
        await client.enqueue("x.anything", 2)


def test_the_sync_client_discards_a_read_only_connection(dsn: str) -> None:
    with SyncJobsClient.connect(dsn, min_size=1, max_size=1) as client:
        pool = client.backend.pool
        with pool.connection() as conn:
            before = conn.info.backend_pid
            conn.execute("SET default_transaction_read_only = on")
        client.enqueue("x.anything", 3)
        with pool.connection() as conn:
            assert conn.info.backend_pid != before


async def test_an_enqueue_to_a_server_that_cannot_take_writes_says_so(dsn: str) -> None:
    dbname = conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{dbname}" SET default_transaction_read_only = on')
        try:
            async with await JobsClient.connect(dsn, min_size=1, max_size=1) as client:
                with pytest.raises(DatabaseUnavailable, match="read-only") as caught:
                    await client.enqueue("x.anything", 4)
                assert "password" not in str(caught.value)
        finally:
            admin.execute(f'ALTER DATABASE "{dbname}" RESET default_transaction_read_only')
        assert admin.execute("SELECT count(*) FROM taskq.jobs").fetchall() == [(0,)]
