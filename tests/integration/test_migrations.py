"""`taskq migrate` against real databases: the catalog it builds, idempotence, concurrency, versions."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from psycopg import AsyncConnection, errors

from taskq import sql
from taskq.backend.migrations import migrate, migrate_dsn
from taskq.client import JobsClient
from taskq.exceptions import MigrationError, SchemaNotReady, SchemaTooNew

EXPECTED_TABLES = {
    "jobs", "job_events", "job_attempts", "workers", "lease_losses", "schema_migrations", "schedules",
    "api_tokens", "operator_requests", "operator_audit", "job_dependencies", "dependency_backlog",
    "queues", "actor_limits", "queue_events", "rate_starts", "web_sessions", "fair_queues", "fairness_weights",
    "job_steps", "job_signals",
}


async def _scalar(conn: AsyncConnection[Any], query: str, params: Any = None) -> Any:
    cur = await conn.execute(query, params)
    row = await cur.fetchone()
    assert row is not None
    return row[0]


async def _insert_job(conn: AsyncConnection[Any], **columns: Any) -> None:
    row = {"actor": "a"} | columns
    names, values = list(row), list(row.values())
    placeholders = ", ".join(["%s"] * len(values))
    await conn.execute(
        f"INSERT INTO taskq.jobs ({', '.join(names)}) VALUES ({placeholders})",
        values,
    )


async def test_migrating_an_empty_database_creates_the_taskq_tables(empty_conn: AsyncConnection[Any]) -> None:
    outcome = await migrate(empty_conn)
    assert outcome.applied == tuple(m.version for m in sql.migrations())
    assert outcome.current == sql.latest_version()
    cur = await empty_conn.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = 'taskq'")
    assert {r[0] for r in await cur.fetchall()} == EXPECTED_TABLES


async def test_migration_records_version_name_and_checksum(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    cur = await empty_conn.execute("SELECT version, name, checksum FROM taskq.schema_migrations ORDER BY version")
    assert await cur.fetchall() == [(m.version, m.name, m.checksum) for m in sql.migrations()]


async def test_migrated_schema_has_the_indexes_the_queries_rely_on(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    cur = await empty_conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'taskq'")
    indexes = dict(await cur.fetchall())
    for name in (
        "jobs_pkey",
        "jobs_claim_idx",
        "jobs_tags_idx",
        "jobs_created_at_idx",
        "jobs_parent_idx",
        "schedules_due_idx",
        "job_events_pkey",
        "job_attempts_pkey",
        "workers_heartbeat_idx",
        "lease_losses_worker_idx",
    ):
        assert name in indexes, f"missing index {name}"
    # a job's events are found by job (schema 22: the key is (job_id, id), no second index); no index on attempts
    # by worker: nothing reads them so
    assert "(job_id, id)" in indexes["job_events_pkey"] and "job_events_job_idx" not in indexes
    assert "job_attempts_open_idx" not in indexes
    assert "USING gin (tags)" in indexes["jobs_tags_idx"]
    assert "WHERE (tags <> '{}'::text[])" in indexes["jobs_tags_idx"]  # tagged jobs only (schema 20)
    claim = indexes["jobs_claim_idx"]
    assert "(queue, priority, fair_tag NULLS FIRST, scheduled_at, id)" in claim
    assert "WHERE" in claim and "'pending'" in claim and "'scheduled'" in claim
    # the heartbeat finds a worker's rows through a partial index on running rows (its name is free); status is
    # a domain over text (schema 21), which the predicates' text shows as a cast
    assert any(
        "ON taskq.jobs USING btree (worker_id" in d and "WHERE ((status)::text = 'running'::text)" in d
        for d in indexes.values()
    ), indexes
    # its cancel poll visits only the held rows with a cancel request
    assert ("WHERE (((status)::text = 'running'::text) AND (cancel_requested_at IS NOT NULL))"
            in indexes["jobs_cancel_held_idx"])
    # lease renewals stay HOT: the per-job lock is in no index
    assert not any("lock_expires_at" in d for d in indexes.values()), indexes


@pytest.mark.parametrize(
    "columns",
    [
        {"status": "paused"},
        {"cancel_phase": 3},
        {"cancel_phase": -1},
        {
            "status": "cancelled",
            "finished_at": datetime.now(UTC),
        },  # cancelled without a cancel request (invariant 3)
        {"status": "running"},  # running without a worker and a lease
        {"status": "succeeded"},  # terminal without finished_at
        {"max_attempts": 0},
        {"actor": ""},
    ],
    ids=[
        "unknown-status",
        "cancel-phase-3",
        "cancel-phase-minus-1",
        "cancelled-without-request",
        "running-without-lease",
        "terminal-without-finished-at",
        "zero-max-attempts",
        "empty-actor",
    ],
)
async def test_check_constraints_reject_impossible_rows(empty_conn: AsyncConnection[Any],
                                                       columns: dict[str, Any]) -> None:
    await migrate(empty_conn)
    with pytest.raises(errors.CheckViolation):
        await _insert_job(empty_conn, **columns)
    assert await _scalar(empty_conn, "SELECT count(*) FROM taskq.jobs") == 0


@pytest.mark.parametrize("phase", [0, 1, 2])
async def test_cancel_phases_zero_to_two_are_storable(empty_conn: AsyncConnection[Any], phase: int) -> None:
    await migrate(empty_conn)
    await _insert_job(empty_conn, cancel_phase=phase)
    assert await _scalar(empty_conn, "SELECT cancel_phase FROM taskq.jobs") == phase


async def test_jobs_is_vacuumed_after_a_fixed_number_of_dead_rows_with_its_index_pass(
    empty_conn: AsyncConnection[Any],
) -> None:
    """Migration 14: the claim walks the dead entries of jobs_claim_idx left since the last vacuum, so jobs is
    vacuumed after 10,000 dead rows whatever its size, and the vacuum always cleans the indexes."""
    await migrate(empty_conn)
    cur = await empty_conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'taskq.jobs'::regclass")
    row = await cur.fetchone()
    assert row is not None and set(row[0]) >= {
        "autovacuum_vacuum_scale_factor=0", "autovacuum_vacuum_threshold=10000", "vacuum_index_cleanup=on"}
    cur = await empty_conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'taskq.job_events'::regclass")
    assert await cur.fetchone() == (None,), "only the hot table has its own settings"


async def test_running_migrate_again_applies_nothing(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    applied_at = await _scalar(empty_conn, "SELECT applied_at FROM taskq.schema_migrations WHERE version = 1")
    again = await migrate(empty_conn)
    assert again.applied == ()
    assert again.current == sql.latest_version()
    assert await _scalar(empty_conn, "SELECT count(*) FROM taskq.schema_migrations") == len(sql.migrations())
    assert await _scalar(empty_conn, "SELECT applied_at FROM taskq.schema_migrations WHERE version = 1") == applied_at


async def test_migrate_refuses_an_applied_migration_whose_file_changed(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    await empty_conn.execute("UPDATE taskq.schema_migrations SET checksum = 'edited' WHERE version = 1")
    with pytest.raises(MigrationError, match=r"migration 0001_initial was applied from a different file"):
        await migrate(empty_conn)
    assert await _scalar(empty_conn, "SELECT count(*) FROM taskq.schema_migrations") == len(sql.migrations())


async def test_two_concurrent_migrations_both_succeed_and_apply_each_version_once(empty_dsn: str) -> None:
    async with (
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as first,
        await psycopg.AsyncConnection.connect(empty_dsn, autocommit=True) as second,
    ):
        outcomes = await asyncio.gather(migrate(first), migrate(second))
        applied = sorted(v for o in outcomes for v in o.applied)
        assert applied == [m.version for m in sql.migrations()]
        assert {o.current for o in outcomes} == {sql.latest_version()}
        assert await _scalar(first, "SELECT count(*) FROM taskq.schema_migrations") == len(sql.migrations())


async def test_migrate_dsn_migrates_and_a_client_can_then_connect(empty_dsn: str) -> None:
    outcome = await migrate_dsn(empty_dsn)
    assert outcome.current == sql.latest_version()
    async with await JobsClient.connect(empty_dsn) as client:
        assert await client.get("00000000-0000-0000-0000-000000000000") is None


async def _record_future_version(conn: AsyncConnection[Any]) -> int:
    future = sql.latest_version() + 1
    await conn.execute(
        "INSERT INTO taskq.schema_migrations (version, name, checksum) VALUES (%s, 'from_the_future', 'x')",
        [future],
    )
    return future


async def test_client_refuses_a_schema_newer_than_the_code(empty_conn: AsyncConnection[Any], empty_dsn: str) -> None:
    await migrate(empty_conn)
    future = await _record_future_version(empty_conn)
    with pytest.raises(SchemaTooNew, match=f"version {future}"):
        await JobsClient.connect(empty_dsn)


async def test_migrate_refuses_a_schema_newer_than_the_code(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    await _record_future_version(empty_conn)
    with pytest.raises(SchemaTooNew, match="upgrade taskq"):
        await migrate(empty_conn)


async def test_client_on_a_database_without_the_schema_says_to_run_taskq_migrate(empty_dsn: str) -> None:
    with pytest.raises(SchemaNotReady, match="`taskq migrate`"):
        await JobsClient.connect(empty_dsn)


async def test_client_on_a_database_with_no_migration_applied_says_to_run_taskq_migrate(
    empty_conn: AsyncConnection[Any], empty_dsn: str
) -> None:
    await empty_conn.execute(sql.query("migrations_bootstrap"))
    with pytest.raises(SchemaNotReady, match="`taskq migrate`"):
        await JobsClient.connect(empty_dsn)
