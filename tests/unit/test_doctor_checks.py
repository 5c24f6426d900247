"""taskq.ops.doctor.evaluate: every check's status at and around its thresholds, from facts built here (no
database; tests/integration/test_doctor.py reads real ones)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from taskq.backend.doctor import Facts, PoolerProbe, Unreadable
from taskq.cli.doctor import exit_code, report_text
from taskq.exitcodes import ExitCode
from taskq.ops.doctor import DEFAULT_THRESHOLDS, Check, Status, evaluate

SERVER: dict[str, Any] = {
    "server_version": "15.8", "database": "app", "role": "taskq_owner", "in_recovery": False, "read_only": False,
    "sees_all": True, "backend_pid": 10, "max_connections": 100, "reserved_connections": 3, "connections": 10,
    "notify_queue_usage": 0.0, "autovacuum": True, "freeze_max_age": 200_000_000,
    "multixact_freeze_max_age": 400_000_000,
}
NO_TRANSACTION: dict[str, Any] = {"pid": None, "role": None, "application_name": None, "state": None,
                                  "database": None, "age": None, "query": None, "hidden": 0}


def healthy(**changes: Any) -> Facts:
    facts = Facts(
        server=dict(SERVER), schema_version=19, latest_version=19, clock_skew=0.01, clock_uncertainty=0.001,
        oldest_transaction=dict(NO_TRANSACTION), xmin_horizon=None, slots=[],
        tables=[{"name": "jobs", "live": 1000, "dead": 10, "autovacuum_ago": 30.0, "vacuum_ago": 30.0,
                 "autovacuum_enabled": True, "vacuum_at": 10_000}],
        xid_age={"database": "app", "xid_age": 5_000, "mxid_age": 10},
        workers={"alive": 2, "expired": 0, "listening": 2, "named": 2, "hidden": 0},
        pooler=PoolerProbe(key_pid=10, pids=(10, 11, 10), options_refused=None),
    )
    return dataclasses.replace(facts, **changes)


def check(facts: Facts, name: str, *, pooler: bool = False) -> Check:
    return next(c for c in evaluate(facts, transaction_pooler=pooler) if c.name == name)


def test_a_healthy_database_is_all_ok_and_exits_0() -> None:
    checks = evaluate(healthy(), transaction_pooler=False)
    assert [c.status for c in checks] == [Status.OK] * len(checks)
    assert exit_code(checks, strict=True) == ExitCode.OK
    assert report_text(checks).endswith(f"all {len(checks)} checks ok")


def transaction(age: float) -> dict[str, Any]:
    return NO_TRANSACTION | {"pid": 42, "role": "app", "application_name": "psql", "state": "idle in transaction",
                             "database": "app", "age": age, "query": "SELECT 1"}


@pytest.mark.parametrize(("age", "status"), [(299.0, Status.OK), (300.0, Status.WARN), (3599.0, Status.WARN),
                                             (3600.0, Status.CRITICAL)])
def test_the_oldest_transaction_warns_at_5_minutes_and_is_critical_at_an_hour(age: float, status: Status) -> None:
    c = check(healthy(oldest_transaction=transaction(age)), "oldest transaction")
    assert c.status is status
    assert "pid 42" in c.value and "idle in transaction" in c.value
    assert ("pg_terminate_backend(42)" in c.action) is (status is not Status.OK)


def test_sessions_a_role_cannot_see_are_a_warning_naming_pg_monitor() -> None:
    facts = healthy(server=SERVER | {"sees_all": False}, oldest_transaction=NO_TRANSACTION | {"hidden": 3})
    c = check(facts, "oldest transaction")
    assert c.status is Status.WARN and "3 other session(s) hidden" in c.value and "pg_monitor" in c.action


@pytest.mark.parametrize(("kind", "holder", "fix"), [("session", "42", "pg_terminate_backend"),
                                                      ("prepared transaction", "tx1", "ROLLBACK PREPARED 'tx1'"),
                                                      ("replication slot", "s1", "pg_drop_replication_slot('s1')")])
def test_the_xmin_horizon_names_its_holder_and_the_fix_for_its_kind(kind: str, holder: str, fix: str) -> None:
    row = {"kind": kind, "holder": holder, "detail": "x", "xid_age": 2_000_000, "seconds": 90.0}
    c = check(healthy(xmin_horizon=row), "xmin horizon")
    assert c.status is Status.WARN and f"{kind} {holder}" in c.value and fix in c.action
    assert check(healthy(xmin_horizon=row | {"xid_age": 999_999}), "xmin horizon").status is Status.OK
    assert check(healthy(xmin_horizon=row | {"xid_age": 100_000_000}), "xmin horizon").status is Status.CRITICAL


def slot(**changes: Any) -> dict[str, Any]:
    return {"name": "s1", "type": "physical", "active": True, "holds_xmin": False, "xid_age": None,
            "retained_wal_bytes": 0} | changes


def test_an_inactive_slot_warns_and_one_holding_xmin_is_critical() -> None:
    assert check(healthy(slots=[slot()]), "replication slots").status is Status.OK
    assert check(healthy(slots=[slot(active=False)]), "replication slots").status is Status.WARN
    c = check(healthy(slots=[slot(active=False, holds_xmin=True)]), "replication slots")
    assert c.status is Status.CRITICAL and "s1" in c.value
    c = check(healthy(slots=[slot(active=False, retained_wal_bytes=3 << 30)]), "replication slots")
    assert c.status is Status.WARN and "3.0 GB of WAL" in c.value


def table(dead: int, vacuum_at: int = 10_000, **changes: Any) -> dict[str, Any]:
    return {"name": "jobs", "live": 100_000, "dead": dead, "autovacuum_ago": 4000.0, "vacuum_ago": 4000.0,
            "autovacuum_enabled": True, "vacuum_at": vacuum_at} | changes


def test_dead_rows_are_judged_against_the_count_at_which_autovacuum_should_have_run() -> None:
    assert check(healthy(tables=[table(19_999)]), "dead rows").status is Status.OK
    c = check(healthy(tables=[table(20_000)]), "dead rows")
    assert c.status is Status.WARN and "jobs: 20,000 dead" in c.value and "autovacuum due at 10,000" in c.value
    assert check(healthy(tables=[table(100_000)]), "dead rows").status is Status.CRITICAL
    # a small table far past its trigger point, but under the floor, is no concern
    assert check(healthy(tables=[table(900, vacuum_at=50, name="queues")]), "dead rows").status is Status.OK
    c = check(healthy(tables=[table(0, autovacuum_enabled=False)]), "dead rows")
    assert c.status is Status.WARN and "autovacuum disabled on jobs" in c.value


def test_transaction_id_age_warns_at_twice_the_freeze_age_and_is_critical_at_a_billion() -> None:
    age = {"database": "app", "mxid_age": 0}
    assert check(healthy(xid_age=age | {"xid_age": 399_999_999}), "transaction ID age").status is Status.OK
    assert check(healthy(xid_age=age | {"xid_age": 400_000_000}), "transaction ID age").status is Status.WARN
    assert check(healthy(xid_age=age | {"xid_age": 1_000_000_000}), "transaction ID age").status is Status.CRITICAL
    assert check(healthy(xid_age=age | {"xid_age": 0, "mxid_age": 800_000_000}),
                 "transaction ID age").status is Status.WARN


def test_fewer_listening_sessions_than_live_workers_warns() -> None:
    workers = {"alive": 3, "expired": 1, "listening": 2, "named": 3, "hidden": 0}
    c = check(healthy(workers=workers), "workers listening")
    assert c.status is Status.WARN and "2 LISTEN session(s) for 3 live worker(s)" in c.value
    assert "1 registration(s) with an expired lease" in c.value
    assert check(healthy(workers=workers | {"alive": 0}), "workers listening").status is Status.OK


def test_a_pooler_refusing_startup_options_is_critical_unless_transaction_pooler_is_on() -> None:
    refused = PoolerProbe(key_pid=99999, pids=(10, 10, 10), options_refused="unsupported startup parameter: options")
    c = check(healthy(pooler=refused), "transaction pooler")
    assert c.status is Status.CRITICAL and "unsupported startup parameter" in c.value
    assert "TASKQ_TRANSACTION_POOLER=1" in c.action
    assert check(healthy(pooler=refused), "transaction pooler", pooler=True).status is Status.OK


def test_transaction_pooling_is_seen_from_backends_shared_or_moving() -> None:
    for pids in ((10, 10, 11), (10, 11, 12), (10, 11, 11)):
        probe = PoolerProbe(key_pid=5, pids=pids, options_refused=None)
        assert check(healthy(pooler=probe), "transaction pooler").status is Status.CRITICAL, pids
    session = PoolerProbe(key_pid=5, pids=(10, 11, 10), options_refused=None)
    c = check(healthy(pooler=session), "transaction pooler")
    assert c.status is Status.OK and "session pooler" in c.value
    # transaction_pooler on a direct connection: it costs LISTEN and prepared statements for nothing
    assert check(healthy(), "transaction pooler", pooler=True).status is Status.WARN


def test_a_standby_and_an_old_schema_are_critical() -> None:
    c = check(healthy(server=SERVER | {"in_recovery": True}), "primary")
    assert c.status is Status.CRITICAL and "target_session_attrs=read-write" in c.action
    c = check(healthy(schema_version=18), "schema")
    assert c.status is Status.CRITICAL and "taskq migrate" in c.action
    c = check(healthy(schema_version=20), "schema")
    assert c.status is Status.CRITICAL and "upgrade taskq" in c.action
    c = check(healthy(schema_version=Unreadable("permission denied for table schema_migrations")), "schema")
    assert c.status is Status.WARN and "permission denied" in c.value


def test_connections_notify_queue_clock_and_autovacuum_thresholds() -> None:
    assert check(healthy(server=SERVER | {"connections": 77}), "connections").status is Status.OK
    assert check(healthy(server=SERVER | {"connections": 78}), "connections").status is Status.WARN
    assert check(healthy(server=SERVER | {"connections": 93}), "connections").status is Status.CRITICAL
    assert check(healthy(server=SERVER | {"notify_queue_usage": 0.1}), "notify queue").status is Status.WARN
    assert check(healthy(server=SERVER | {"notify_queue_usage": 0.5}), "notify queue").status is Status.CRITICAL
    assert check(healthy(clock_skew=-1.5), "clock skew").status is Status.WARN
    assert check(healthy(clock_skew=1.05, clock_uncertainty=0.1), "clock skew").status is Status.OK  # within noise
    assert check(healthy(clock_skew=45.0), "clock skew").status is Status.CRITICAL
    assert check(healthy(server=SERVER | {"autovacuum": False}), "autovacuum").status is Status.CRITICAL
    # a worker host's clock, as its heartbeats report it
    skewed = {"alive": 2, "expired": 0, "listening": 2, "named": 2, "hidden": 0, "skewed_worker": "h2:7:ab"}
    c = check(healthy(workers=skewed | {"worker_clock_offset": -3.25}), "clock skew")
    assert c.status is Status.WARN and "h2:7:ab" in c.value and "3.250s behind" in c.value
    assert check(healthy(workers=skewed | {"worker_clock_offset": 0.01}), "clock skew").status is Status.OK
    assert check(healthy(workers=skewed | {"worker_clock_offset": 60.0}), "clock skew").status is Status.CRITICAL


def test_warnings_exit_0_unless_strict_and_a_critical_check_exits_16() -> None:
    warned = evaluate(healthy(clock_skew=2.0), transaction_pooler=False)
    assert exit_code(warned, strict=False) == ExitCode.OK
    assert exit_code(warned, strict=True) == ExitCode.UNHEALTHY
    assert int(ExitCode.UNHEALTHY) == 16
    critical = evaluate(healthy(schema_version=3), transaction_pooler=False)
    assert exit_code(critical, strict=False) == ExitCode.UNHEALTHY
    assert "- schema (critical): run `taskq migrate`" in report_text(critical)


def test_the_default_thresholds_are_ordered() -> None:
    t = DEFAULT_THRESHOLDS
    assert t.transaction_warn < t.transaction_critical and t.horizon_warn < t.horizon_critical
    assert t.dead_warn < t.dead_critical and t.connections_warn < t.connections_critical
    assert t.notify_warn < t.notify_critical and t.clock_warn < t.clock_critical
