"""Retention of the web API's idempotency receipts and operator audit rows: each on its own window, in
bounded batches, through the one prune service; the audit's one-hour floor; a receipt past the 24 h
idempotency window is taken over by a new request even before the pruner ran; the batches read the
created_at / at indexes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import psycopg
import pytest
from testkit import query

from taskq import sql
from taskq.backend import Backend
from taskq.models import PruneClass
from taskq.ops.retention import prune

pytestmark = pytest.mark.timeout(120)

HOUR = 3600.0
DAY = 86400.0


def seed_receipts(dsn: str, age: float, n: int, prefix: str) -> None:
    query(dsn, "INSERT INTO taskq.operator_requests (principal, key, fingerprint, status, body, created_at)"
               " SELECT 'ops', %s || g, 'fp', 200, '{}'::jsonb, now() - %s * interval '1 second'"
               " FROM generate_series(1, %s) AS g", prefix, age, n)


def seed_audit(dsn: str, age: float, n: int) -> None:
    query(dsn, "INSERT INTO taskq.operator_audit (at, principal, action, outcome)"
               " SELECT now() - %s * interval '1 second', 'ops', 'jobs:cancel', 'cancelled'"
               " FROM generate_series(1, %s)", age, n)


def counts(dsn: str) -> tuple[int, int]:
    (row,) = query(dsn, "SELECT (SELECT count(*) FROM taskq.operator_requests),"
                        " (SELECT count(*) FROM taskq.operator_audit)")
    return int(row[0]), int(row[1])


def windows(receipts: float = 0.0, audit: float = 0.0) -> dict[PruneClass, float]:
    return {PruneClass.SUCCEEDED: 0.0, PruneClass.FAILED: 0.0, PruneClass.ATTEMPTS: 0.0,
            PruneClass.RECEIPTS: receipts, PruneClass.AUDIT: audit}


async def test_receipts_and_audit_rows_go_on_their_own_windows_in_bounded_batches(dsn: str) -> None:
    seed_receipts(dsn, 2 * DAY, 450, "old-")
    seed_receipts(dsn, HOUR, 5, "young-")
    seed_audit(dsn, 100 * DAY, 330)
    seed_audit(dsn, 10 * DAY, 7)
    backend = await Backend.open(dsn, max_size=1)
    try:
        dry = await prune(backend, windows(receipts=DAY, audit=90 * DAY), dry_run=True)
        assert (dry.receipts, dry.audit, dry.dry_run) == (450, 330, True)
        assert counts(dsn) == (455, 337)
        result = await prune(backend, windows(receipts=DAY, audit=90 * DAY), batch_size=100, pause_ratio=0.0)
    finally:
        await backend.close()
    assert (result.receipts, result.audit, result.total) == (450, 330, 780)
    assert result.batches >= 5 + 4  # 100 rows a batch: bounded, each committed on its own
    assert counts(dsn) == (5, 7)
    assert query(dsn, "SELECT count(*) FROM taskq.operator_requests WHERE key LIKE 'young-%%'") == [(5,)]


async def test_a_window_of_zero_keeps_receipts_and_audit_forever(dsn: str) -> None:
    seed_receipts(dsn, 30 * DAY, 3, "k-")
    seed_audit(dsn, 400 * DAY, 3)
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, windows())
        only_receipts = await prune(backend, windows(receipts=DAY))
    finally:
        await backend.close()
    assert (result.receipts, result.audit) == (0, 0)
    assert (only_receipts.receipts, only_receipts.audit) == (3, 0)
    assert counts(dsn) == (0, 3)


async def test_the_audit_keeps_its_last_hour_whatever_window_is_given(dsn: str) -> None:
    seed_audit(dsn, 2 * HOUR, 4)
    seed_audit(dsn, 60.0, 6)
    backend = await Backend.open(dsn, max_size=1)
    try:
        result = await prune(backend, windows(audit=1.0))
    finally:
        await backend.close()
    assert result.audit == 4 and counts(dsn) == (0, 6)
    # the owner function keeps the floor even when handed the ids of young rows
    with psycopg.connect(dsn, autocommit=True) as conn:
        deleted = conn.execute("SELECT taskq.delete_operator_audit(ARRAY(SELECT id FROM taskq.operator_audit), 0)"
                               ).fetchone()
    assert deleted == (0,) and counts(dsn) == (0, 6)


def claim(dsn: str, key: str, fingerprint: str) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql.query("receipt_claim"),
                           {"principal": "ops", "key": key, "fingerprint": fingerprint}).fetchone()
    return None if row is None else row[0]


def test_a_key_is_honoured_for_24_hours_then_is_a_new_request(dsn: str) -> None:
    query(dsn, "INSERT INTO taskq.operator_requests (principal, key, fingerprint, status, body, created_at) VALUES"
               " ('ops', 'fresh', 'a', 200, '{}', now() - interval '23 hours'),"
               " ('ops', 'stale', 'a', 200, '{}', now() - interval '25 hours')")
    assert claim(dsn, "fresh", "b") is None  # inside the window: the stored receipt answers (replay or 422)
    assert claim(dsn, "stale", "b") == "stale"  # past it, not yet pruned: the new request takes the key over
    assert query(dsn, "SELECT key, fingerprint, status, body, created_at > now() - interval '1 minute'"
                      " FROM taskq.operator_requests ORDER BY key") == [
        ("fresh", "a", 200, {}, False), ("stale", "b", None, None, True)]


def explain(dsn: str, name: str, params: dict[str, Any]) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction(force_rollback=True):
        rows = conn.execute("EXPLAIN " + sql.query(name), params).fetchall()
    return "\n".join(r[0] for r in rows)


def test_the_batches_read_the_created_at_and_at_indexes(dsn: str) -> None:
    seed_receipts(dsn, 60.0, 20_000, "live-")
    seed_receipts(dsn, 2 * DAY, 200, "old-")
    seed_audit(dsn, 60.0, 20_000)
    seed_audit(dsn, 100 * DAY, 200)
    query(dsn, "ANALYZE taskq.operator_requests")
    query(dsn, "ANALYZE taskq.operator_audit")
    params = {"keep": DAY, "limit": 1000}
    receipts = explain(dsn, "prune_receipts", params)
    audit = explain(dsn, "prune_audit", params | {"keep": 90 * DAY})
    assert "operator_requests_created_idx" in receipts and "Seq Scan" not in receipts, receipts
    assert "operator_audit_at_idx" in audit and "Seq Scan" not in audit, audit


def run_prune(dsn: str, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"TASKQ_DSN": dsn} | extra
    return subprocess.run([sys.executable, "-m", "taskq.cli", "prune", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_cli_prune_deletes_receipts_and_audit_past_their_windows(dsn: str) -> None:
    seed_receipts(dsn, 2 * DAY, 3, "old-")
    seed_receipts(dsn, HOUR, 2, "young-")
    seed_audit(dsn, 91 * DAY, 4)
    seed_audit(dsn, 89 * DAY, 1)
    dry = run_prune(dsn, "--dry-run", "--json")
    assert dry.returncode == 0, dry
    assert (json.loads(dry.stdout)["receipts"], json.loads(dry.stdout)["audit"]) == (3, 4)
    text = run_prune(dsn)  # the defaults: receipts 1 day, audit 90 days
    assert text.returncode == 0 and text.stderr == "", text
    assert "idempotency receipts             3" in text.stdout and "operator audit rows              4" in text.stdout
    assert counts(dsn) == (2, 1)
    kept = run_prune(dsn, "--retention-audit", "0", "--json", TASKQ_RETENTION_RECEIPTS="1800")
    assert kept.returncode == 0 and json.loads(kept.stdout)["receipts"] == 2 and json.loads(kept.stdout)["audit"] == 0


@pytest.mark.parametrize(("flag", "value"), [("--retention-receipts", "-1"), ("--retention-audit", "nan")])
def test_cli_refuses_a_bad_receipts_or_audit_window_and_deletes_nothing(dsn: str, flag: str, value: str) -> None:
    seed_receipts(dsn, 10 * DAY, 1, "k-")
    seed_audit(dsn, 400 * DAY, 1)
    result = run_prune(dsn, f"{flag}={value}")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskq: error: ") and flag[2:].replace("-", "_") in lines[0]
    assert counts(dsn) == (1, 1)
