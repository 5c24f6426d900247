"""Shared fixtures: one real PostgreSQL per test session (embedded unless TASKQ_TEST_DSN is set),
a migrated template database, and a fresh clone of it for every test that asks for `dsn`."""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from testkit import PASSWORD_ROLE_PREFIX, PgBouncer

from taskq.backend.migrations import migrate_dsn
from taskq.client import JobsClient

_SESSION_TAG = uuid.uuid4().hex[:8]


def _admin_dsn() -> Iterator[str]:
    explicit = os.environ.get("TASKQ_TEST_DSN")
    if explicit:
        yield explicit
        return
    from taskq.embedded import embedded_dsn, stop_embedded

    root = Path(tempfile.mkdtemp(prefix="taskq-test-pg-"))
    os.chmod(root, 0o755)
    previous = os.environ.get("TASKQ_DATA_DIR")
    os.environ["TASKQ_DATA_DIR"] = str(root)
    try:
        dsn = embedded_dsn()
        _require_passwords_for_password_roles(dsn)
        yield dsn
    finally:
        stop_embedded(root)
        if previous is None:
            os.environ.pop("TASKQ_DATA_DIR", None)
        else:
            os.environ["TASKQ_DATA_DIR"] = previous


def _require_passwords_for_password_roles(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SHOW hba_file").fetchone()
        assert row is not None
        hba = Path(row[0])
        # the first matching line wins, so this goes before the embedded server's trust lines
        hba.write_text(f"local all /^{PASSWORD_ROLE_PREFIX} scram-sha-256\n" + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """A DSN with rights to create databases on the test server."""
    yield from _admin_dsn()


def with_dbname(dsn: str, dbname: str) -> str:
    return make_conninfo(dsn, dbname=dbname)


@pytest.fixture(scope="session")
def template_db(admin_dsn: str) -> Iterator[str]:
    """A database migrated once per session, cloned for each test."""
    name = f"taskq_tmpl_{_SESSION_TAG}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    asyncio.run(migrate_dsn(with_dbname(admin_dsn, name)))
    yield name
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def _create_db(admin_dsn: str, template: str | None) -> tuple[str, str]:
    name = f"taskq_t_{uuid.uuid4().hex[:12]}"
    query = pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name))
    if template:
        query = pgsql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
            pgsql.Identifier(name), pgsql.Identifier(template)
        )
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(query)
    return name, with_dbname(admin_dsn, name)


def _drop_db(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


@pytest.fixture
def dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A fresh, fully migrated database for this test."""
    name, test_dsn = _create_db(admin_dsn, template_db)
    yield test_dsn
    _drop_db(admin_dsn, name)


@pytest.fixture(scope="module")
def module_dsn(admin_dsn: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by the tests of one module (for seed data too costly to make per test)."""
    name, test_dsn = _create_db(admin_dsn, template_db)
    try:
        yield test_dsn
    finally:
        _drop_db(admin_dsn, name)


@pytest.fixture
def empty_dsn(admin_dsn: str) -> Iterator[str]:
    """A fresh database with no taskq schema at all."""
    name, test_dsn = _create_db(admin_dsn, None)
    yield test_dsn
    _drop_db(admin_dsn, name)


@pytest.fixture
async def empty_conn(empty_dsn: str) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """An autocommit connection to `empty_dsn` (for the tests of migrations and upgrades)."""
    async with await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as c:
        yield c


@pytest.fixture
async def client(dsn: str) -> AsyncIterator[JobsClient]:
    c = await JobsClient.connect(dsn)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="session")
def pgbouncer(admin_dsn: str) -> Iterator[PgBouncer]:
    """A real PgBouncer (transaction mode) in front of the test server, for the whole session. Its folder
    is not under pytest's own (private to the user), because PgBouncer may run as another user."""
    bouncer = PgBouncer(admin_dsn, Path(tempfile.mkdtemp(prefix="taskq-test-pgbouncer-")))
    bouncer.start()
    yield bouncer
    bouncer.stop()


@pytest.fixture
def pooled_dsn(dsn: str, pgbouncer: PgBouncer) -> str:
    """This test's database, reached through PgBouncer in transaction mode."""
    return pgbouncer.dsn_for(dsn)
