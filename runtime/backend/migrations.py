"""`taskq migrate`: apply pending numbered migrations, each in its own transaction under an advisory lock."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import AsyncConnection

from taskq import sql
from taskq.backend._conn import connect_error
from taskq.exceptions import MigrationError, SchemaTooNew

# pg_advisory_xact_lock key: the bytes "taskq" read as an integer, so other tools' keys do not collide
MIGRATION_LOCK_KEY = int.from_bytes(b"taskq", "big")


@dataclass(frozen=True)
class MigrationOutcome:
    applied: tuple[int, ...]
    current: int


def migration_names() -> dict[int, str]:
    """The name of every migration this taskq ships, by version."""
    return {m.version: m.name for m in sql.migrations()}


async def _applied(conn: AsyncConnection[Any]) -> dict[int, str]:
    cur = await conn.execute(sql.query("migrations_applied"))
    return {int(v): str(c) for v, _, c in await cur.fetchall()}


async def migrate(conn: AsyncConnection[Any]) -> MigrationOutcome:
    """Bring the schema up to date. Safe to run twice, or twice at once (the second waits, then no-ops)."""
    known = sql.migrations()
    async with conn.transaction():
        await conn.execute(sql.query("migrations_lock"), {"key": MIGRATION_LOCK_KEY})
        try:
            await conn.execute(sql.query("migrations_bootstrap"))
        except psycopg.errors.InsufficientPrivilege as exc:
            raise MigrationError(
                f"cannot create the taskq schema ({str(exc).splitlines()[0]}): run `taskq migrate` as the role "
                "that owns the taskq schema, with CREATE on the database (see docs/security.md)"
            ) from None
    applied_now: list[int] = []
    for migration in known:
        async with conn.transaction():
            await conn.execute(sql.query("migrations_lock"), {"key": MIGRATION_LOCK_KEY})
            done = await _applied(conn)
            if migration.version in done:
                if done[migration.version] != migration.checksum:
                    raise MigrationError(
                        f"migration {migration.version:04d}_{migration.name} was applied from a different file "
                        f"(checksum {done[migration.version][:12]}..., this taskq ships {migration.checksum[:12]}...): "
                        "an applied migration must never change; install the taskq release that applied it"
                    )
                continue
            try:
                await conn.execute(migration.sql)
            except psycopg.Error as exc:
                raise MigrationError(f"migration {migration.version:04d}_{migration.name} failed: {exc}") from exc
            await conn.execute(
                sql.query("migrations_record"),
                {"version": migration.version, "name": migration.name, "checksum": migration.checksum},
            )
            applied_now.append(migration.version)
    done = await _applied(conn)
    newest = max(done, default=0)
    if newest > known[-1].version:
        raise SchemaTooNew(
            f"the taskq schema is at version {newest}, newer than this taskq knows ({known[-1].version}): upgrade taskq"
        )
    return MigrationOutcome(applied=tuple(applied_now), current=newest)


async def migrate_dsn(dsn: str) -> MigrationOutcome:
    try:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise connect_error(dsn, exc) from None
    async with conn:
        return await migrate(conn)
