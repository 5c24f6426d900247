"""Schema 21 (sql/0021_job_domains.sql): taskq.jobs's single-column checks as domain types. Upgrading a database
that holds jobs neither rewrites the table nor changes a row; every check still refuses what it refused, naming
the same constraint; clients read the columns as their base types."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import AsyncConnection, errors
from testkit import migrate_until

from taskq.backend.migrations import migrate

DOMAIN_CHECKS = {
    "actor": "jobs_actor_check", "attempt": "jobs_attempt_check", "cancel_phase": "jobs_cancel_phase_check",
    "claim_epoch": "jobs_claim_epoch_check", "concurrency_key": "jobs_concurrency_key_length",
    "dependency_mode": "jobs_dependency_mode_known", "fairness_key": "jobs_fairness_key_text",
    "interrupt_count": "jobs_interrupt_count_check", "max_attempts": "jobs_max_attempts_check",
    "parents_remaining": "jobs_parents_remaining_positive", "queue": "jobs_queue_check",
    "requeue_count": "jobs_requeue_count_positive", "revision": "jobs_revision_check",
    "snooze_count": "jobs_snooze_count_check", "status": "jobs_status_check", "unique_key": "jobs_unique_key_text",
    "unique_scope": "jobs_unique_scope_known", "wait_kind": "jobs_wait_kind_known",
    "wait_signal": "jobs_wait_signal_text",
}
# one value per column that its check refuses (with what else the row needs to be otherwise valid)
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("actor", {"actor": ""}), ("actor", {"actor": "a" * 256}), ("attempt", {"attempt": -1}),
    ("cancel_phase", {"cancel_phase": 3}), ("claim_epoch", {"claim_epoch": -1}),
    ("concurrency_key", {"concurrency_key": ""}), ("dependency_mode", {"dependency_mode": "sometimes"}),
    ("fairness_key", {"fairness_key": "a\nb"}), ("interrupt_count", {"interrupt_count": -1}),
    ("max_attempts", {"max_attempts": 0}), ("parents_remaining", {"parents_remaining": -1}),
    ("queue", {"queue": ""}), ("requeue_count", {"requeue_count": -1}), ("revision", {"revision": 0}),
    ("snooze_count", {"snooze_count": -1}), ("status", {"status": "paused"}),
    ("unique_key", {"unique_key": "", "unique_scope": "active"}),
    ("unique_scope", {"unique_key": "k", "unique_scope": "forever"}), ("wait_kind", {"wait_kind": "nap"}),
    ("wait_signal", {"wait_kind": "signal", "wait_signal": "a\tb"}),
]
ROWS = """
INSERT INTO taskq.jobs (actor, queue, status, attempt, claim_epoch, worker_id, lock_expires_at, started_at,
                        unique_key, unique_scope, concurrency_key, fairness_key, fair_tag, max_attempts,
                        finished_at, cancel_requested_at, priority, tags)
SELECT 'app.act' || (i % 3), 'q' || (i % 2),
       (ARRAY['pending', 'scheduled', 'running', 'succeeded', 'cancelled'])[i % 5 + 1],
       i % 4, i % 4, CASE WHEN i % 5 = 2 THEN 'w1' END, CASE WHEN i % 5 = 2 THEN now() + interval '1 minute' END,
       CASE WHEN i % 5 >= 2 THEN now() END, CASE WHEN i % 7 = 0 THEN 'key-' || i END,
       CASE WHEN i % 7 = 0 THEN 'retained' END, CASE WHEN i % 3 = 0 THEN 'tenant-' || (i % 4) END,
       CASE WHEN i % 2 = 0 THEN 'fair-' || (i % 5) END, CASE WHEN i % 2 = 0 THEN i END, 1 + i % 5,
       CASE WHEN i % 5 >= 3 THEN now() END, CASE WHEN i % 5 = 4 THEN now() END, i % 3, ARRAY['t' || (i % 2)]
FROM generate_series(1, 2000) AS i
"""


async def table_text(conn: AsyncConnection[Any]) -> list[tuple[Any, ...]]:
    cur = await conn.execute("SELECT j::text FROM taskq.jobs AS j ORDER BY id")
    return await cur.fetchall()


async def test_the_upgrade_keeps_every_row_and_rewrites_nothing(empty_conn: AsyncConnection[Any]) -> None:
    await migrate_until(empty_conn, 20)
    await empty_conn.execute(ROWS)
    before = await table_text(empty_conn)
    cur = await empty_conn.execute("SELECT pg_relation_filenode('taskq.jobs')")
    (filenode,) = await cur.fetchone() or (None,)
    outcome = await migrate(empty_conn)
    assert outcome.applied[0] == 21  # and the later ones, which do not touch taskq.jobs
    assert await table_text(empty_conn) == before and len(before) == 2000
    cur = await empty_conn.execute("SELECT pg_relation_filenode('taskq.jobs')")
    assert await cur.fetchone() == (filenode,), "the migration rewrote taskq.jobs"
    cur = await empty_conn.execute(
        "SELECT a.attname, t.typname FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid "
        "WHERE a.attrelid = 'taskq.jobs'::regclass AND t.typtype = 'd'")
    assert dict(await cur.fetchall()) == {column: f"jobs_{column}" for column in DOMAIN_CHECKS}
    # no check over one column is left on the table, and the indexes are valid
    cur = await empty_conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'taskq.jobs'::regclass "
                             "AND contype = 'c' AND cardinality(conkey) = 1")
    assert await cur.fetchone() == (0,)
    cur = await empty_conn.execute("SELECT count(*) FROM pg_index WHERE indrelid = 'taskq.jobs'::regclass "
                             "AND NOT (indisvalid AND indisready)")
    assert await cur.fetchone() == (0,)


async def test_clients_read_the_domain_columns_as_their_base_types(empty_conn: AsyncConnection[Any]) -> None:
    await migrate(empty_conn)
    await empty_conn.execute(ROWS)
    cur = await empty_conn.execute("SELECT actor, status, attempt, claim_epoch, cancel_phase, revision, unique_key "
                             "FROM taskq.jobs WHERE unique_key IS NOT NULL LIMIT 1")
    row = await cur.fetchone()
    assert row is not None
    assert [type(v) for v in row] == [str, str, int, int, int, int, str]
    assert cur.description is not None
    assert [c.type_code for c in cur.description] == [25, 25, 23, 20, 21, 20, 25]  # text, int4, int8, int2


@pytest.mark.parametrize(("column", "values"), REFUSED, ids=[f"{c}-{i}" for i, (c, _) in enumerate(REFUSED)])
async def test_each_domain_refuses_what_its_check_refused(
    empty_conn: AsyncConnection[Any], column: str, values: dict[str, Any]
) -> None:
    await migrate(empty_conn)
    row = {"actor": "a"} | values
    with pytest.raises(errors.CheckViolation) as raised:
        await empty_conn.execute(f"INSERT INTO taskq.jobs ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                           list(row.values()))
    assert raised.value.diag.constraint_name == DOMAIN_CHECKS[column]
    # an update of a stored row is checked too, and leaves the row as it was
    await empty_conn.execute("INSERT INTO taskq.jobs (actor) VALUES ('a')")
    before = await table_text(empty_conn)
    with pytest.raises(errors.CheckViolation):
        await empty_conn.execute(f"UPDATE taskq.jobs SET {', '.join(f'{k} = %s' for k in values)}",
                                 list(values.values()))
    assert await table_text(empty_conn) == before


@pytest.mark.parametrize("call", [
    "taskq.job_claim_queue_limited(ARRAY['q'], 5, 'w1', 30)",
    "taskq.job_claim_limited(ARRAY['q'], 5, 50, 'w1', 30)",
    "taskq.job_claim_queue_limited_v16(ARRAY['q'], 5, 'w1', 30, NULL, NULL)",
    "taskq.job_claim_limited_v16(ARRAY['q'], 5, 50, 'w1', 30, NULL, NULL)",
])
async def test_the_limited_claims_of_every_release_still_claim(empty_conn: AsyncConnection[Any], call: str) -> None:
    # a worker of an earlier release calls its own version during a rolling upgrade; PL/pgSQL's RETURN QUERY
    # refuses a domain where the result says text, so each one's select list casts (schema 21)
    await migrate(empty_conn)
    await empty_conn.execute("INSERT INTO taskq.queues (name, concurrency_limit) VALUES ('q', 3)")
    await empty_conn.execute("INSERT INTO taskq.jobs (actor, queue) SELECT 'app.act', 'q' FROM generate_series(1, 5)")
    cur = await empty_conn.execute(f"SELECT actor, queue, attempt, max_attempts, claim_epoch FROM {call}")
    assert await cur.fetchall() == [("app.act", "q", 1, 3, 1)] * 3
