"""taskq.queue_depth_v19 (sql/0019_queue_depth.sql): the number an autoscaler reads (docs/kubernetes.md).

Seeded states give exact values: due jobs and running jobs count, jobs scheduled later, awaiting their
parents or finished do not, a paused queue's jobs do not, and the value is never NULL. Its plan reads the
partial indexes only, so the finished history does not make it dearer: `TASKQ_DEPTH_ROWS=1000000 pytest
tests/integration/test_queue_depth.py -k history -s` prints EXPLAIN (ANALYZE, BUFFERS) at a million finished
jobs (the figures are in docs/kubernetes.md)."""

from __future__ import annotations

import os
import re

import psycopg
import pytest
from testkit import query

pytestmark = pytest.mark.timeout(300)


def depth(dsn: str, queues: list[str] | None = None) -> object:
    if queues is None:
        return query(dsn, "SELECT taskq.queue_depth_v19()")[0][0]
    return query(dsn, "SELECT taskq.queue_depth_v19(%s::text[])", queues)[0][0]


def add(dsn: str, n: int, *, queue: str = "default", status: str = "pending", delay: str = "0 s") -> None:
    """`n` jobs in `status`; pending and scheduled ones due `delay` from now (negative: in the past)."""
    running = status == "running"
    query(
        dsn,
        "INSERT INTO taskq.jobs (actor, queue, status, scheduled_at, attempt, worker_id, lock_expires_at, "
        "started_at, finished_at, cancel_requested_at, parents_remaining, dependency_mode) "
        "SELECT 'depth.x', %s, %s, now() + %s::interval, %s, %s, %s, %s, %s, %s, %s, %s FROM generate_series(1, %s)",
        queue, status, delay, 1 if running or status in ("succeeded", "failed", "cancelled") else 0,
        "w1" if running else None, "infinity" if running else None, "now" if running else None,
        "now" if status in ("succeeded", "failed", "cancelled") else None,
        "now" if status == "cancelled" else None,
        1 if status == "awaiting_parents" else 0, "on_success" if status == "awaiting_parents" else None, n,
    )


def pause(dsn: str, queue: str) -> None:
    query(dsn, "INSERT INTO taskq.queues (name, paused_at, paused_by) VALUES (%s, now(), 'test') "
               "ON CONFLICT (name) DO UPDATE SET paused_at = now(), paused_by = 'test'", queue)


def test_an_empty_database_has_depth_zero_not_null(dsn: str) -> None:
    assert depth(dsn) == 0
    assert depth(dsn, ["default"]) == 0
    assert depth(dsn, []) == 0


def test_due_jobs_count_and_jobs_scheduled_later_do_not(dsn: str) -> None:
    add(dsn, 100)
    assert depth(dsn, ["default"]) == 100
    add(dsn, 100, status="scheduled", delay="1 hour")
    assert depth(dsn, ["default"]) == 100
    add(dsn, 7, status="scheduled", delay="-1 minute")  # a retry whose backoff is over: due
    assert depth(dsn, ["default"]) == 107
    assert depth(dsn) == 107


def test_running_jobs_count_and_finished_or_waiting_jobs_do_not(dsn: str) -> None:
    add(dsn, 50, status="running")
    assert depth(dsn, ["default"]) == 50
    for status in ("succeeded", "failed", "cancelled", "awaiting_parents"):
        add(dsn, 10, status=status)
    assert depth(dsn, ["default"]) == 50
    add(dsn, 100)
    assert depth(dsn, ["default"]) == 150


def test_only_the_queues_named_count(dsn: str) -> None:
    add(dsn, 100)
    add(dsn, 30, queue="emails")
    add(dsn, 5, queue="emails", status="running")
    add(dsn, 20, queue="reports")
    assert depth(dsn, ["default"]) == 100
    assert depth(dsn, ["emails"]) == 35
    assert depth(dsn, ["emails", "reports"]) == 55
    assert depth(dsn, ["emails", "emails"]) == 35
    assert depth(dsn, ["nope"]) == 0
    assert depth(dsn) == 155


def test_a_paused_queue_is_left_out_and_counts_again_once_resumed(dsn: str) -> None:
    add(dsn, 100)
    add(dsn, 40, queue="emails")
    add(dsn, 10, queue="emails", status="running")
    pause(dsn, "emails")
    assert depth(dsn, ["emails"]) == 0
    assert depth(dsn, ["default", "emails"]) == 100
    assert depth(dsn) == 100
    query(dsn, "UPDATE taskq.queues SET paused_at = NULL, paused_by = NULL WHERE name = 'emails'")
    assert depth(dsn, ["emails"]) == 50
    # a queue with limits but no pause still counts
    query(dsn, "UPDATE taskq.queues SET concurrency_limit = 1 WHERE name = 'emails'")
    assert depth(dsn) == 150


def test_it_is_stable_and_never_null_in_its_declaration(dsn: str) -> None:
    ((volatility, returns, definer),) = query(
        dsn, "SELECT p.provolatile, p.prorettype::regtype::text, p.prosecdef FROM pg_proc AS p "
             "WHERE p.oid = 'taskq.queue_depth_v19(text[])'::regprocedure")
    assert (volatility, returns, definer) == ("s", "bigint", True)


def test_public_cannot_execute_it(dsn: str, admin_dsn: str) -> None:
    role = "taskq_depth_nobody"
    query(admin_dsn, f"DROP ROLE IF EXISTS {role}")
    query(admin_dsn, f"CREATE ROLE {role} LOGIN")
    try:
        query(dsn, f"GRANT USAGE ON SCHEMA taskq TO {role}")
        with psycopg.connect(dsn, user=role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT taskq.queue_depth_v19()")
        query(dsn, f"GRANT EXECUTE ON FUNCTION taskq.queue_depth_v19(text[]) TO {role}")
        add(dsn, 3)
        with psycopg.connect(dsn, user=role) as conn:
            # the count, without any privilege on the jobs themselves
            assert conn.execute("SELECT taskq.queue_depth_v19(ARRAY['default'])").fetchone() == (3,)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT count(*) FROM taskq.jobs")
        query(dsn, f"REVOKE ALL ON SCHEMA taskq FROM {role}")
        query(dsn, f"REVOKE ALL ON FUNCTION taskq.queue_depth_v19(text[]) FROM {role}")
    finally:
        query(admin_dsn, f"DROP ROLE IF EXISTS {role}")


BODY = {
    # the function's two statements for a list of queues, as plpgsql prepares them (queues and paused: $1, $2)
    "due": "SELECT count(*) FROM taskq.jobs AS j WHERE j.status IN ('pending', 'scheduled') "
           "AND j.scheduled_at <= now() AND j.queue = ANY ($1) AND j.queue <> ALL ($2)",
    "running": "SELECT count(*) FROM taskq.jobs AS j WHERE j.status = 'running' AND j.queue = ANY ($1) "
               "AND j.queue <> ALL ($2)",
    "due, every queue": "SELECT count(*) FROM taskq.jobs AS j WHERE j.status IN ('pending', 'scheduled') "
                        "AND j.scheduled_at <= now() AND j.queue <> ALL ($2)",
    "running, every queue": "SELECT count(*) FROM taskq.jobs AS j WHERE j.status = 'running' "
                            "AND j.queue <> ALL ($2)",
}


def _explain(conn: psycopg.Connection[tuple[object, ...]], statement: str, mode: str) -> str:
    conn.execute(f"SET plan_cache_mode = {mode}")
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE depth_part(text[], text[]) AS {statement}")
    rows = conn.execute("EXPLAIN (ANALYZE, BUFFERS) EXECUTE depth_part('{default}', '{paused}')").fetchall()
    return "\n".join(str(r[0]) for r in rows)


def test_a_long_finished_history_is_not_read(dsn: str) -> None:
    rows = int(os.environ.get("TASKQ_DEPTH_ROWS", "100000"))
    add(dsn, rows, status="succeeded")
    add(dsn, 100)
    add(dsn, 100, status="scheduled", delay="1 hour")
    add(dsn, 50, status="running")
    add(dsn, 30, queue="paused")
    pause(dsn, "paused")
    query(dsn, "VACUUM (ANALYZE) taskq.jobs")
    assert depth(dsn, ["default"]) == 150
    assert depth(dsn) == 150
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        for name, statement in BODY.items():
            for mode in ("force_custom_plan", "force_generic_plan"):
                plan = _explain(conn, statement, mode)
                print(f"\n-- {name} ({mode}) at {rows} finished jobs\n{plan}")
                assert "Seq Scan" not in plan and "Index" in plan, plan
                executed = plan.split("Planning:")[0].splitlines()[1]  # the top node's buffers
                read = sum(int(n) for n in re.findall(r"(?:hit|read)=(\d+)", executed))
                assert read < 100, f"{read} buffers at {rows} finished jobs:\n{plan}"
        conn.execute("RESET plan_cache_mode")
        for call in ("SELECT taskq.queue_depth_v19(ARRAY['default'])", "SELECT taskq.queue_depth_v19()"):
            times = []
            for _ in range(20):
                lines = [str(r[0]) for r in conn.execute(f"EXPLAIN (ANALYZE, BUFFERS) {call}").fetchall()]
                times.append(float(re.findall(r"Execution Time: ([0-9.]+) ms", "\n".join(lines))[0]))
            times.sort()
            print(f"\n-- {call}: median {times[10]:.3f} ms, slowest {times[-1]:.3f} ms of 20 calls")
            assert times[10] < 5.0, times
