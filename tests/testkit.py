"""Helpers shared by the tests: an in-process worker, and waiting on conditions with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from taskq import sql
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


def insert_job(dsn: str, actor: str, payload: Any, max_attempts: int = 3) -> UUID:
    """A job written as a producer that does not import the actor would write it (no validation, no
    option but max_attempts), then the NOTIFY that wakes the workers of the default queue."""
    (row,) = query(
        dsn,
        "INSERT INTO taskq.jobs (actor, payload, max_attempts) VALUES (%s, %s::jsonb, %s) RETURNING id",
        actor, json.dumps(payload), max_attempts,
    )
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return UUID(str(row[0]))


class PgBouncer:
    """A real PgBouncer in transaction mode in front of the test server, started for the test session.

    Every database of the server is reachable through it under its own name (a `*` entry). As root it
    drops to another account (PgBouncer refuses to run as root): the owner of the server's socket
    directory, which is private to it on the embedded server."""

    def __init__(self, upstream_dsn: str, workdir: Path) -> None:
        self.upstream = conninfo_to_dict(upstream_dsn)
        self.workdir = workdir
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "pgbouncer.log"

    def start(self, timeout: float = 15.0) -> None:
        binary = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
        )
        if binary is None:
            message = "pgbouncer is not installed (Debian: apt-get install pgbouncer; .ci/run installs it)"
            if os.environ.get("TASKQ_REQUIRE_PGBOUNCER"):
                raise RuntimeError(message)
            pytest.skip(message)
        host = str(self.upstream.get("host") or "localhost")
        port = str(self.upstream.get("port") or "5432")
        user = str(self.upstream.get("user") or "postgres")
        (self.workdir / "users.txt").write_text(f'"{user}" ""\n')
        (self.workdir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={host} port={port}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.workdir / 'users.txt'}\n"
            "pool_mode = transaction\n"
            "default_pool_size = 40\n"
            "max_client_conn = 2000\n"
            f"logfile = {self.log_path}\n"
            "ignore_startup_parameters = extra_float_digits\n"
        )
        args = [binary]
        if os.geteuid() == 0:
            os.chmod(self.workdir, 0o777)
            for name in ("users.txt", "pgbouncer.ini"):
                os.chmod(self.workdir / name, 0o644)
            # the account that owns the server's socket directory can reach the socket; anyone can reach TCP
            owner = pwd.getpwuid(os.stat(host).st_uid).pw_name if host.startswith("/") else "nobody"
            args += ["-u", owner]
        args.append(str(self.workdir / "pgbouncer.ini"))
        with open(self.workdir / "pgbouncer.out", "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                log = (self.workdir / "pgbouncer.out").read_text(errors="replace")
                log += self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
                raise RuntimeError(f"pgbouncer exited with {self.proc.returncode}: {log}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer did not listen on port {self.port} within {timeout}s") from None
                time.sleep(0.05)

    def dsn_for(self, dsn: str) -> str:
        """The same database and user as `dsn`, through this PgBouncer."""
        params = conninfo_to_dict(dsn)
        return make_conninfo(host="127.0.0.1", port=str(self.port), dbname=params.get("dbname") or "postgres",
                             user=params.get("user") or "postgres")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebServer:
    """A real `taskq web` process on a free loopback port, for the API and browser tests."""

    def __init__(self, dsn: str, *args: str, log_path: Path | None = None) -> None:
        import sys

        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "TASKQ_DSN": dsn}
        command = [sys.executable, "-m", "taskq.cli", "web", "--port", str(self.port), *args]
        if log_path is not None:
            with open(log_path, "wb") as out:  # the child keeps its own copy of the descriptor
                self.proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        else:
            self.proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_until(self._up, timeout=30)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            log = self.log_path.read_text() if self.log_path is not None else ""
            raise AssertionError(f"taskq web exited with {self.proc.returncode}: {log}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def migrate_until(conn: psycopg.AsyncConnection[Any], version: int) -> None:
    """The migrations up to `version` as `taskq migrate` applies them, recorded, so that migrate() goes on: a
    database of an older schema, for an upgrade test."""
    await conn.execute(sql.query("migrations_bootstrap"))
    for migration in sql.migrations():
        if migration.version > version:
            break
        async with conn.transaction():
            await conn.execute(migration.sql)
            await conn.execute(sql.query("migrations_record"), {"version": migration.version, "name": migration.name,
                                                                "checksum": migration.checksum})
