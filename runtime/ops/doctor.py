"""`taskq doctor`: what hurts a PostgreSQL queue before it hurts, as checks with a status (ok, warn,
critical), the value measured and what to do. `diagnose` reads the facts (taskq.backend.doctor) and
`evaluate` judges them; `evaluate` is a pure function of the facts and the thresholds, so every threshold is
unit-tested without a database. The thresholds and why they are where they are: docs/doctor.md."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from taskq.backend.doctor import Facts, PoolerProbe, Unreadable, collect


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    CRITICAL = "critical"


_RANK = {Status.OK: 0, Status.WARN: 1, Status.CRITICAL: 2}


@dataclass(frozen=True)
class Check:
    """One check: its name, status, the value measured (one line) and, unless ok, what to do."""

    name: str
    status: Status
    value: str
    action: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Thresholds:
    """Where a check turns warn and critical (docs/doctor.md says why)."""

    transaction_warn: float = 300.0
    """Seconds a transaction (idle in transaction too) has been open."""
    transaction_critical: float = 3600.0
    horizon_warn: int = 1_000_000
    """Transactions since the oldest xmin any session, prepared transaction or slot holds."""
    horizon_critical: int = 100_000_000
    dead_warn: float = 2.0
    """Dead rows of a taskq table, in multiples of the count at which autovacuum should have taken it."""
    dead_critical: float = 10.0
    dead_floor: int = 1_000
    """Dead rows below which a table is never a concern (a small table's ratio moves a lot)."""
    xid_warn_factor: float = 2.0
    """Transaction-ID age, in multiples of autovacuum_freeze_max_age (anti-wraparound vacuum lagging)."""
    xid_critical: int = 1_000_000_000
    """Transaction-ID age; PostgreSQL stops assigning IDs at about 2,100,000,000."""
    connections_warn: float = 0.8
    """Share of the connections a client may open (max_connections - superuser_reserved_connections)."""
    connections_critical: float = 0.95
    notify_warn: float = 0.1
    """Share of the NOTIFY queue in use (8 GB by default; full, every NOTIFY and so every enqueue fails)."""
    notify_critical: float = 0.5
    clock_warn: float = 1.0
    """Seconds between this host's clock and the database's."""
    clock_critical: float = 30.0
    wal_warn_bytes: int = 1 << 30
    """WAL an inactive replication slot keeps on the server's disk."""


DEFAULT_THRESHOLDS = Thresholds()

PG_MONITOR = "GRANT pg_monitor TO {role} (as a superuser) so that doctor sees every session"


def worst(checks: list[Check]) -> Status:
    return max((c.status for c in checks), key=_RANK.__getitem__, default=Status.OK)


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _count(n: float) -> str:
    return f"{n:,.0f}"


def _level(value: float, warn: float, critical: float) -> Status:
    if value >= critical:
        return Status.CRITICAL
    return Status.WARN if value >= warn else Status.OK


def _unreadable(name: str, what: Unreadable, role: str) -> Check:
    return Check(name, Status.WARN, f"cannot read: {what.reason}",
                 f"run doctor as a role that may read it (the owner, or {PG_MONITOR.format(role=role)})")


def check_primary(facts: Facts) -> Check:
    s = facts.server
    if s["in_recovery"]:
        return Check("primary", Status.CRITICAL, f"a standby (PostgreSQL {s['server_version']}): read-only",
                     "point the DSN at the primary: every taskq write fails here (SQLSTATE 25006); with several "
                     "hosts add target_session_attrs=read-write")
    if s["read_only"]:
        return Check("primary", Status.CRITICAL, "default_transaction_read_only is on",
                     f"ALTER ROLE {s['role']} / DATABASE {s['database']} SET default_transaction_read_only = off: "
                     "every taskq write fails")
    return Check("primary", Status.OK, f"primary, PostgreSQL {s['server_version']}, database {s['database']}")


def check_schema(facts: Facts) -> Check:
    version, latest = facts.schema_version, facts.latest_version
    if isinstance(version, Unreadable):
        return _unreadable("schema", version, facts.server["role"])
    if version < latest:
        return Check("schema", Status.CRITICAL, f"version {version}, this taskq needs {latest}",
                     "run `taskq migrate` (workers and clients of this taskq refuse an older schema)",
                     {"version": version, "code": latest})
    if version > latest:
        return Check("schema", Status.CRITICAL, f"version {version}, newer than this taskq knows ({latest})",
                     "upgrade taskq where it runs against this database", {"version": version, "code": latest})
    return Check("schema", Status.OK, f"version {version}, as this taskq expects", detail={"version": version})


def check_oldest_transaction(facts: Facts, t: Thresholds) -> Check:
    row = facts.oldest_transaction
    role = facts.server["role"]
    if isinstance(row, Unreadable):
        return _unreadable("oldest transaction", row, role)
    hidden = int(row["hidden"] or 0)
    if row["pid"] is None or row["age"] is None:
        if hidden and not facts.server["sees_all"]:
            return Check("oldest transaction", Status.WARN, f"none visible; {hidden} other session(s) hidden",
                         PG_MONITOR.format(role=role), {"hidden": hidden})
        return Check("oldest transaction", Status.OK, "no other open transaction")
    age = float(row["age"])
    status = _level(age, t.transaction_warn, t.transaction_critical)
    value = (f"{_duration(age)}: pid {row['pid']} ({row['state']}, role {row['role']}, "
             f"app {row['application_name'] or '-'}, database {row['database']})")
    detail = {k: row[k] for k in ("pid", "role", "application_name", "state", "database", "age", "query")}
    action = ""
    if status is not Status.OK:
        action = (f"end it (SELECT pg_terminate_backend({row['pid']})) or fix the code that holds it; while it is "
                  "open VACUUM removes no row dead since it began. Set idle_in_transaction_session_timeout")
    elif hidden and not facts.server["sees_all"]:
        status, action = Status.WARN, PG_MONITOR.format(role=role)
        value += f"; {hidden} other session(s) hidden"
    return Check("oldest transaction", status, value, action, detail)


def check_xmin_horizon(facts: Facts, t: Thresholds) -> Check:
    row = facts.xmin_horizon
    if isinstance(row, Unreadable):
        return _unreadable("xmin horizon", row, facts.server["role"])
    if row is None:
        return Check("xmin horizon", Status.OK, "nothing else holds back VACUUM")
    age = int(row["xid_age"] or 0)
    held = f" for {_duration(float(row['seconds']))}" if row["seconds"] is not None else ""
    value = f"{_count(age)} transactions behind: {row['kind']} {row['holder']} ({row['detail']}){held}"
    status = _level(age, t.horizon_warn, t.horizon_critical)
    action = ""
    if status is not Status.OK:
        action = {
            "session": f"end session {row['holder']} (pg_terminate_backend) or its long query; a standby's "
                       "hot_standby_feedback shows as its walsender",
            "prepared transaction": f"COMMIT PREPARED or ROLLBACK PREPARED '{row['holder']}' (a forgotten "
                                    "two-phase transaction holds the horizon forever)",
            "replication slot": f"let its consumer catch up, or SELECT pg_drop_replication_slot('{row['holder']}') "
                                "if nothing reads it",
        }.get(str(row["kind"]), "")
        action += "; no row dead since it began can be vacuumed, so taskq's tables and indexes bloat"
    return Check("xmin horizon", status, value, action, dict(row))


def check_slots(facts: Facts, t: Thresholds) -> Check:
    slots = facts.slots
    if isinstance(slots, Unreadable):
        return _unreadable("replication slots", slots, facts.server["role"])
    if not slots:
        return Check("replication slots", Status.OK, "none")
    inactive = [s for s in slots if not s["active"]]
    holding = [s for s in inactive if s["holds_xmin"]]
    heavy = [s for s in inactive if (s["retained_wal_bytes"] or 0) >= t.wal_warn_bytes]
    value = f"{len(slots)} slot(s), {len(inactive)} inactive"
    if heavy:
        value += "; " + ", ".join(f"{s['name']} keeps {(s['retained_wal_bytes'] or 0) / (1 << 30):.1f} GB of WAL"
                                  for s in heavy)
    detail = {"slots": slots}
    if holding:
        names = ", ".join(str(s["name"]) for s in holding)
        return Check("replication slots", Status.CRITICAL, value + f"; inactive and holding xmin: {names}",
                     "drop the slots nothing reads any more (pg_drop_replication_slot): an inactive slot with an "
                     "xmin stops VACUUM everywhere and keeps WAL until the disk fills", detail)
    if heavy or inactive:
        return Check("replication slots", Status.WARN, value,
                     "an inactive slot keeps WAL on disk until its consumer returns: drop it if none will "
                     "(pg_drop_replication_slot)", detail)
    return Check("replication slots", Status.OK, value, detail=detail)


def check_tables(facts: Facts, t: Thresholds) -> Check:
    tables = facts.tables
    if isinstance(tables, Unreadable):
        return _unreadable("dead rows", tables, facts.server["role"])
    worst_row: dict[str, Any] | None = None
    worst_status, worst_factor = Status.OK, 0.0
    disabled = [str(r["name"]) for r in tables if not r["autovacuum_enabled"]]
    for r in tables:
        dead = int(r["dead"] or 0)
        factor = dead / max(int(r["vacuum_at"] or 0), 1)
        status = Status.OK if dead < t.dead_floor else _level(factor, t.dead_warn, t.dead_critical)
        if (_RANK[status], factor) > (_RANK[worst_status], worst_factor):
            worst_row, worst_status, worst_factor = r, status, factor
    if worst_status is Status.OK:  # nothing to point at: show the queue's own table
        worst_row = next((r for r in tables if r["name"] == "jobs"), worst_row)
    detail = {"tables": tables}
    if worst_row is None:
        return Check("dead rows", Status.OK, "no taskq table has statistics yet", detail=detail)
    dead, live = int(worst_row["dead"] or 0), int(worst_row["live"] or 0)
    ratio = dead / max(dead + live, 1)
    ago = worst_row["autovacuum_ago"]
    value = (f"{worst_row['name']}: {_count(dead)} dead of {_count(dead + live)} rows ({ratio:.0%}; autovacuum "
             f"due at {_count(int(worst_row['vacuum_at'] or 0))}), last autovacuum "
             + (f"{_duration(float(ago))} ago" if ago is not None else "never"))
    action = ""
    if worst_status is not Status.OK:
        action = ("autovacuum is not keeping up: look at the xmin horizon and oldest transaction checks (a held "
                  "horizon makes dead rows unremovable), then VACUUM (VERBOSE) taskq." + str(worst_row["name"]))
    if disabled:
        worst_status = max(worst_status, Status.WARN, key=_RANK.__getitem__)
        value += "; autovacuum disabled on " + ", ".join(disabled)
        action = (action + "; " if action else "") + "re-enable autovacuum on taskq's tables (ALTER TABLE ... RESET " \
            "(autovacuum_enabled))"
    return Check("dead rows", worst_status, value, action, detail)


def check_xid_age(facts: Facts, t: Thresholds) -> Check:
    row = facts.xid_age
    if isinstance(row, Unreadable):
        return _unreadable("transaction ID age", row, facts.server["role"])
    xid, mxid = int(row["xid_age"] or 0), int(row["mxid_age"] or 0)
    warn_xid = t.xid_warn_factor * int(facts.server["freeze_max_age"])
    warn_mxid = t.xid_warn_factor * int(facts.server["multixact_freeze_max_age"])
    status = max(_level(xid, warn_xid, t.xid_critical), _level(mxid, warn_mxid, t.xid_critical), key=_RANK.__getitem__)
    value = f"{_count(xid)} transactions, {_count(mxid)} multixacts (database {row['database']})"
    action = ""
    if status is not Status.OK:
        action = ("anti-wraparound vacuum is behind: clear the xmin horizon, then VACUUM (FREEZE) the oldest tables "
                  f"of {row['database']}; PostgreSQL stops all writes near 2,100,000,000")
    return Check("transaction ID age", status, value, action, dict(row))


def check_workers(facts: Facts) -> Check:
    row = facts.workers
    role = facts.server["role"]
    if isinstance(row, Unreadable):
        return _unreadable("workers listening", row, role)
    alive, listening, named = int(row["alive"]), int(row["listening"]), int(row["named"])
    hidden, expired = int(row["hidden"] or 0), int(row["expired"])
    value = f"{listening} LISTEN session(s) for {alive} live worker(s); {named} worker(s) with named connections"
    if expired:
        value += f"; {expired} registration(s) with an expired lease"
    detail = dict(row)
    if alive == 0:
        return Check("workers listening", Status.OK, value, detail=detail)
    if listening >= alive:
        return Check("workers listening", Status.OK, value, detail=detail)
    if hidden and not facts.server["sees_all"]:
        return Check("workers listening", Status.WARN, value + f"; {hidden} session(s) hidden",
                     PG_MONITOR.format(role=role), detail)
    return Check("workers listening", Status.WARN, value,
                 "a worker without LISTEN finds jobs by polling (up to poll_interval late) and hears of cancels with "
                 "its heartbeat: expected with transaction_pooler and no listen_dsn; otherwise look for "
                 "'LISTEN connection lost' in its log", detail)


def check_pooler(facts: Facts, transaction_pooler: bool) -> Check:
    probe = facts.pooler
    setting = "transaction_pooler is " + ("on" if transaction_pooler else "off")
    if isinstance(probe, Unreadable):
        return Check("transaction pooler", Status.WARN, f"not probed: {probe.reason}; {setting}",
                     "free a connection slot and run doctor again")
    assert isinstance(probe, PoolerProbe)
    detail = {"announced_pid": probe.key_pid, "backend_pids": list(probe.pids),
              "options_refused": probe.options_refused, "transaction_pooler": transaction_pooler}
    fix = ("set transaction_pooler (TASKQ_TRANSACTION_POOLER=1 or --transaction-pooler) for every worker, client "
           "and CLI on this DSN, and give workers a direct listen_dsn")
    if probe.options_refused is not None:
        value = f"startup options refused ({probe.options_refused}); {setting}"
        if transaction_pooler:
            return Check("transaction pooler", Status.OK, value, detail=detail)
        return Check("transaction pooler", Status.CRITICAL, value,
                     "every worker fails to connect here with this error: " + fix, detail)
    if probe.shares_backends:
        value = f"transaction pooling: one connection's transactions ran in backends {list(probe.pids)}; {setting}"
        if transaction_pooler:
            return Check("transaction pooler", Status.OK, value, detail=detail)
        return Check("transaction pooler", Status.CRITICAL, value,
                     "prepared statements, session settings and LISTEN break behind it: " + fix, detail)
    if probe.proxied:
        return Check("transaction pooler", Status.OK,
                     f"a proxy or a session pooler (the server's pid is not the one announced); {setting}",
                     detail=detail)
    if transaction_pooler:
        return Check("transaction pooler", Status.WARN, f"a direct connection; {setting}",
                     "turn transaction_pooler off for this DSN: it costs prepared statements and, without "
                     "listen_dsn, LISTEN", detail)
    return Check("transaction pooler", Status.OK, f"a direct connection; {setting}", detail=detail)


def check_clock(facts: Facts, t: Thresholds) -> Check:
    skew, within = facts.clock_skew, facts.clock_uncertainty
    direction = "ahead of" if skew > 0 else "behind"
    value = f"the database is {abs(skew):.3f}s {direction} this host (within {within:.3f}s)"
    status = _level(max(abs(skew) - within, 0.0), t.clock_warn, t.clock_critical)
    detail: dict[str, Any] = {"skew": skew, "uncertainty": within}
    workers = facts.workers
    offset = None if isinstance(workers, Unreadable) else workers.get("worker_clock_offset")
    if offset is not None:
        worker = workers["skewed_worker"]  # type: ignore[index]
        value += (f"; the live worker furthest off is {worker}, its clock {abs(offset):.3f}s "
                  f"{'ahead of' if offset > 0 else 'behind'} the database's (its last heartbeat)")
        detail |= {"worker": worker, "worker_offset": offset}
        worker_status = _level(abs(offset), t.clock_warn, t.clock_critical)
        if _RANK[worker_status] > _RANK[status]:
            status = worker_status
    else:
        value += "; no live worker has reported its clock"
    action = ""
    if status is not Status.OK:
        action = ("sync the host's clock (NTP/chrony): a delay enqueued from there (`--at +5m`, timedelta) and a "
                  "worker's local timeouts land off by the skew; leases, limits and schedules use the database's "
                  "clock")
    return Check("clock skew", status, value, action, detail)


def check_connections(facts: Facts, t: Thresholds) -> Check:
    s = facts.server
    usable = max(int(s["max_connections"]) - int(s["reserved_connections"]), 1)
    used = int(s["connections"])
    status = _level(used / usable, t.connections_warn, t.connections_critical)
    action = ""
    if status is not Status.OK:
        action = ("taskq's pools wait for a slot and then fail: fewer or smaller pools (a worker keeps up to "
                  "4 + concurrency/50), a pooler, or a higher max_connections")
    return Check("connections", status, f"{used} of {usable} in use", action, {"used": used, "usable": usable})


def check_notify_queue(facts: Facts, t: Thresholds) -> Check:
    usage = float(facts.server["notify_queue_usage"] or 0.0)
    status = _level(usage, t.notify_warn, t.notify_critical)
    action = ""
    if status is not Status.OK:
        action = ("a listening session is not reading (often idle in transaction): end it; when the queue is full "
                  "every NOTIFY fails, and with it every enqueue that sends one")
    return Check("notify queue", status, f"{usage:.1%} used", action, {"usage": usage})


def check_autovacuum(facts: Facts) -> Check:
    if facts.server["autovacuum"]:
        return Check("autovacuum", Status.OK, "on")
    return Check("autovacuum", Status.CRITICAL, "off for the whole server",
                 "turn autovacuum on: a queue's tables fill with dead rows within minutes, and only autovacuum "
                 "prevents transaction-ID wraparound")


def evaluate(facts: Facts, *, transaction_pooler: bool, thresholds: Thresholds = DEFAULT_THRESHOLDS) -> list[Check]:
    """Every check of the facts, in the order doctor shows them."""
    t = thresholds
    return [
        check_primary(facts),
        check_schema(facts),
        check_pooler(facts, transaction_pooler),
        check_oldest_transaction(facts, t),
        check_xmin_horizon(facts, t),
        check_slots(facts, t),
        check_tables(facts, t),
        check_autovacuum(facts),
        check_xid_age(facts, t),
        check_workers(facts),
        check_connections(facts, t),
        check_notify_queue(facts, t),
        check_clock(facts, t),
    ]


async def diagnose(dsn: str, *, transaction_pooler: bool, thresholds: Thresholds = DEFAULT_THRESHOLDS,
                   timeout: float = 10.0) -> list[Check]:
    """Read the database's health and judge it. DatabaseUnavailable if it cannot be reached, SchemaNotReady if
    it has no taskq schema."""
    facts = await collect(dsn, timeout=timeout)
    return evaluate(facts, transaction_pooler=transaction_pooler, thresholds=thresholds)
