"""`taskq doctor` against a real server: a healthy database, a held transaction and snapshot, an inactive
replication slot, dead rows autovacuum is not taking, workers listening or not, a real PgBouncer in
transaction mode, a database without taskq's schema, and the monitoring role of sql/roles.sql.
(Each threshold is tests/unit/test_doctor_checks.py's.)"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo
from test_security_roles import create_roles, drop_roles, psql_binary, roles_script
from testkit import query, running_worker, wait_for

from taskq.actors.declaration import ActorRegistry, actor
from taskq.ops.doctor import Check, Status, Thresholds, diagnose

pytestmark = pytest.mark.timeout(120)

registry = ActorRegistry()


@actor(name="doctor.noop", registry=registry)
async def noop(payload: int) -> int:
    return payload


def doctor(dsn: str, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | (env or {})
    result = subprocess.run([sys.executable, "-m", "taskq.cli", "--dsn", dsn, "doctor", *args], env=full_env,
                            capture_output=True, text=True, timeout=60, check=False)
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    return result.returncode, result.stdout, result.stderr


def checks_of(stdout: str) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in json.loads(stdout)["checks"]}


def by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


def test_a_healthy_database_passes_every_check_and_prints_a_table(dsn: str) -> None:
    code, out, err = doctor(dsn)
    assert (code, err) == (0, ""), out
    assert out.splitlines()[0].split() == ["check", "status", "value"]
    assert out.rstrip().endswith("checks ok")
    code, out, _ = doctor(dsn, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["status"] == "ok" and all(c["status"] == "ok" for c in report["checks"])
    checks = checks_of(out)
    assert checks["schema"]["detail"]["version"] >= 19
    assert checks["transaction pooler"]["value"].startswith("a direct connection")


async def test_a_transaction_held_open_is_named_with_its_pid_and_holds_the_horizon(dsn: str) -> None:
    held = await psycopg.AsyncConnection.connect(dsn, application_name="forgotten-report")
    try:
        await held.execute("SELECT txid_current()")  # idle in transaction from here, with an xid and a snapshot
        pid = held.info.backend_pid
        for _ in range(3):  # age the horizon by a few transactions
            query(dsn, "SELECT txid_current()")
        tight = Thresholds(transaction_warn=0.001, horizon_warn=1)
        checks = by_name(await diagnose(dsn, transaction_pooler=False, thresholds=tight))
        oldest = checks["oldest transaction"]
        assert oldest.status is Status.WARN
        assert f"pid {pid}" in oldest.value and "idle in transaction" in oldest.value
        assert "forgotten-report" in oldest.value and f"pg_terminate_backend({pid})" in oldest.action
        horizon = checks["xmin horizon"]
        assert horizon.status is Status.WARN and f"session {pid}" in horizon.value
        # with the default thresholds a few seconds are fine
        checks = by_name(await diagnose(dsn, transaction_pooler=False))
        assert checks["oldest transaction"].status is Status.OK and f"pid {pid}" in checks["oldest transaction"].value
    finally:
        await held.close()
    checks = by_name(await diagnose(dsn, transaction_pooler=False, thresholds=Thresholds(transaction_warn=0.001)))
    assert f"pid {pid}" not in checks["oldest transaction"].value


def test_an_inactive_replication_slot_warns_and_is_named(dsn: str) -> None:
    name = f"doctor_{uuid.uuid4().hex[:8]}"
    query(dsn, "SELECT pg_create_physical_replication_slot(%s, true)", name)
    try:
        code, out, _ = doctor(dsn, "--json")
        slots = checks_of(out)["replication slots"]
        assert code == 0 and slots["status"] == "warn", slots
        assert "1 inactive" in slots["value"] and "pg_drop_replication_slot" in slots["action"]
        assert [s["name"] for s in slots["detail"]["slots"]] == [name]
        code, _, _ = doctor(dsn, "--strict")
        assert code == 16
    finally:
        query(dsn, "SELECT pg_drop_replication_slot(%s)", name)


async def test_dead_rows_autovacuum_does_not_take_are_reported(dsn: str) -> None:
    query(dsn, "ALTER TABLE taskq.job_events SET (autovacuum_enabled = false, autovacuum_vacuum_threshold = 1000)")
    query(dsn, "INSERT INTO taskq.job_events (job_id, kind) SELECT gen_random_uuid(), 'note' "
               "FROM generate_series(1, 3000)")
    query(dsn, "DELETE FROM taskq.job_events")

    async def reported() -> Check | None:
        check = by_name(await diagnose(dsn, transaction_pooler=False))["dead rows"]
        return check if "job_events: 3,000 dead" in check.value else None

    check = await wait_for(reported, timeout=20, interval=0.5)  # statistics reach the views within a second or so
    assert check.status is Status.WARN  # 3,000 dead: three times the trigger point of 1,000 (critical at ten)
    assert "autovacuum disabled on job_events" in check.value and "VACUUM (VERBOSE) taskq.job_events" in check.action


async def test_live_workers_are_counted_against_the_sessions_that_listen(dsn: str) -> None:
    async with running_worker(dsn, registry) as worker:
        await wait_for(worker.parts.listener.connected.is_set)
        workers = by_name(await diagnose(dsn, transaction_pooler=False))["workers listening"]
        assert workers.status is Status.OK and workers.detail["alive"] == 1, workers
        assert workers.detail["listening"] >= 1 and workers.detail["named"] == 1
        # its heartbeats report its clock: the same host's, so within a fraction of a second
        await wait_for(lambda: query(dsn, "SELECT clock_offset FROM taskq.workers")[0][0] is not None)
        clock = by_name(await diagnose(dsn, transaction_pooler=False))["clock skew"]
        assert clock.detail["worker"] == worker.worker_id and abs(clock.detail["worker_offset"]) < 0.5, clock
        assert clock.status is Status.OK
    workers = by_name(await diagnose(dsn, transaction_pooler=False))["workers listening"]
    assert workers.detail["alive"] == 0 and workers.status is Status.OK


async def test_a_worker_through_pgbouncer_without_listen_dsn_is_seen_not_listening(dsn: str, pooled_dsn: str) -> None:
    async with running_worker(pooled_dsn, registry, transaction_pooler=True):
        workers = by_name(await diagnose(dsn, transaction_pooler=False))["workers listening"]
        assert workers.status is Status.WARN and workers.detail == workers.detail | {"alive": 1, "listening": 0}
        assert "poll_interval" in workers.action


def test_pgbouncer_without_transaction_pooler_is_critical_and_names_the_setting(pooled_dsn: str) -> None:
    code, out, err = doctor(pooled_dsn)
    assert code == 16 and err == ""
    assert "unsupported startup parameter: options" in out and "TASKQ_TRANSACTION_POOLER=1" in out
    code, out, _ = doctor(pooled_dsn, "--json")
    pooler = checks_of(out)["transaction pooler"]
    assert pooler["status"] == "critical" and pooler["detail"]["announced_pid"] not in pooler["detail"]["backend_pids"]
    for args, env in ((("--transaction-pooler",), None), ((), {"TASKQ_TRANSACTION_POOLER": "1"})):
        code, out, _ = doctor(pooled_dsn, "--json", *args, env=env)
        assert checks_of(out)["transaction pooler"]["status"] == "ok", out
        assert code == 0, out


def test_a_database_without_the_taskq_schema_is_one_line_naming_taskq_migrate(empty_dsn: str) -> None:
    code, out, err = doctor(empty_dsn)
    assert (code, out) == (5, "")
    assert err.splitlines() == ["taskq: error: the database has no taskq schema: run `taskq migrate`"]


def test_an_unreachable_server_is_exit_3(dsn: str) -> None:
    code, out, err = doctor(make_conninfo(dsn, host="127.0.0.1", port="1", connect_timeout="2"))
    assert code == 3 and out == "" and len(err.splitlines()) == 1 and "cannot connect to PostgreSQL" in err


def test_the_monitor_role_runs_doctor_and_the_depth_and_reads_no_job(admin_dsn: str, dsn: str) -> None:
    psql = psql_binary()
    if psql is None:
        pytest.skip("the monitor role's section of roles.sql needs psql (\\if)")
    tag = uuid.uuid4().hex[:8]
    worker, client, monitor = f"taskq_worker_{tag}", f"taskq_client_{tag}", f"taskq_monitor_{tag}"
    create_roles(admin_dsn, worker, client, monitor)
    try:
        result = subprocess.run(
            [psql, dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"worker_role={worker}", "-v",
             f"client_role={client}", "-v", f"monitor_role={monitor}", "-f", "-"],
            input=roles_script(), capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        monitor_dsn = make_conninfo(dsn, user=monitor)
        query(dsn, "INSERT INTO taskq.jobs (actor) SELECT 'doctor.noop' FROM generate_series(1, 4)")
        with psycopg.connect(monitor_dsn) as conn:
            assert conn.execute("SELECT taskq.queue_depth_v19(ARRAY['default'])").fetchone() == (4,)
        with psycopg.connect(monitor_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT payload FROM taskq.jobs")
        with psycopg.connect(make_conninfo(dsn, user=client)) as conn:
            assert conn.execute("SELECT taskq.queue_depth_v19()").fetchone() == (4,)
        # other sessions hidden: doctor says so rather than failing
        held = psycopg.connect(dsn)
        try:
            held.execute("SELECT txid_current()")
            code, out, _ = doctor(monitor_dsn, "--json")
            checks = checks_of(out)
            assert code == 0, out
            assert checks["schema"]["status"] == "ok" and checks["workers listening"]["status"] == "ok"
            oldest = checks["oldest transaction"]
            assert oldest["status"] == "warn", oldest
            assert "hidden" in oldest["value"] and "pg_monitor" in oldest["action"]
            query(admin_dsn, f"GRANT pg_monitor TO {monitor}")
            code, out, _ = doctor(monitor_dsn, "--json")
            oldest = checks_of(out)["oldest transaction"]
            assert oldest["status"] == "ok" and f"pid {held.info.backend_pid}" in oldest["value"], oldest
        finally:
            held.close()
    finally:
        drop_roles(admin_dsn, dsn, worker, client, monitor)


WRITES = "SELECT sum(n_tup_ins + n_tup_upd + n_tup_del) FROM pg_stat_user_tables WHERE schemaname = 'taskq'"


def test_diagnose_is_read_only(dsn: str) -> None:
    before = query(dsn, WRITES)
    asyncio.run(diagnose(dsn, transaction_pooler=False))
    query(dsn, "SELECT pg_stat_force_next_flush()")
    after = query(dsn, WRITES)
    assert before == after
