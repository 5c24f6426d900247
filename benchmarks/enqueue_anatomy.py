"""Where a single enqueue's PostgreSQL time goes: the insert of one job per commit, taken apart.

    python benchmarks/enqueue_anatomy.py [--dsn DSN] [--jobs 5000] [--rounds 5] [--json out.json]

One connection, autocommit, one prepared INSERT per commit, as `client.enqueue` sends it; the CPU time
of the backend serving it (from /proc, so the server must run on this machine) and the wall time per insert.
Each variant is the one before it less one thing, on a table of its own (a copy of taskq.jobs made with
`LIKE ... INCLUDING ...`, then pruned), so the differences between rows say what each thing costs a job
that does not use it:

- `taskq.jobs`: the statement `job_insert` on the real table (notify false: the NOTIFY is `+ notify`);
- `+ notify`: the same with its pg_notify (a single enqueue on a quiet queue notifies at once);
- `copy`: the same statement on a copy with every index and check constraint (sanity: ≈ the first);
- `copy, checks on the table`: the copy as it was before schema 21, each domain column retyped to its base type
  and the domain's checks (19 of 25) put on the table (a side row, like `+ notify`: the cumulative steps below
  go on from `copy`);
- `- tags GIN`, `- created_at`, `- claim by actor`, `- claim`: the copy less those indexes, cumulatively;
- `- partial indexes`: less every other partial index (their predicates are evaluated per insert);
- `- checks`: less the check constraints (the table's, and the domains': their columns retyped to base types);
- `- fair lookup`: a plain INSERT of the same values (no fair_queues lookup, no CASE);
- `lean`: a table of (id uuid primary key, payload jsonb): the floor, what a bare insert costs.

Every variant runs once per round, in rotation, each table truncated before its turn; medians of the rounds.
After its inserts, each variant's rows are updated one per statement as a claim does it (status running,
attempt, claim_epoch, revision, worker and lease): the `UPDATE` column, PostgreSQL CPU per one-row update.
PostgreSQL prepares a table's check constraints for each statement that writes to it (the expression read,
planned and compiled again each time), so a one-row statement pays for all of them; a domain's checks are
planned once per session (its type cache) and only for the columns the statement writes. Since schema 21 the
checks over one column are domains (the `copy` row); the side row puts them back on the table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    CLOCK_TICKS,
    DSN_HELP,
    RESULTS_DIR,
    bench_database,
    header,
    machine,
    print_table,
    server_facts,
    write_report,
)

from taskq import sql
from taskq.backend import uuid7

JOBS_COLUMNS = ("id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at, schedule_to_close, "
                "parent_id, workflow_id, idempotent, trace_context, concurrency_key, fairness_key, fair_tag")
PLAIN_INSERT = (f"INSERT INTO {{table}} ({JOBS_COLUMNS}) VALUES (%(id)s, %(actor)s, %(queue)s, %(payload)s::jsonb, "
                "'pending', %(priority)s, %(tags)s::text[], %(max_attempts)s, now(), NULL, NULL, NULL, %(idempotent)s, "
                "NULL, NULL, NULL, NULL) RETURNING status, scheduled_at, schedule_to_close, created_at")
LEAN_INSERT = "INSERT INTO anat.lean (id, payload) VALUES (%(id)s, %(payload)s::jsonb)"
CLAIM_UPDATE = ("UPDATE {table} SET revision = revision + 1, status = 'running', attempt = attempt + 1, "
                "claim_epoch = claim_epoch + 1, worker_id = 'w', lock_expires_at = now() + interval '30 seconds', "
                "started_at = now(), cancel_phase = 0 WHERE id = %s")
CUMULATIVE_DROPS: list[tuple[str, list[str]]] = [
    ("- tags GIN", ["jobs_tags_idx"]),
    ("- created_at", ["jobs_created_at_idx"]),
    ("- claim by actor", ["jobs_claim_actor_idx"]),
    ("- claim", ["jobs_claim_idx"]),
]


@dataclass
class Variant:
    name: str
    table: str
    statement: str
    notify: bool = False
    cpu_us: list[float] = field(default_factory=list)
    wall_us: list[float] = field(default_factory=list)
    update_us: list[float] = field(default_factory=list)


def _index_on(conn: psycopg.Connection[Any], table: str, like: str) -> str:
    """The copy of taskq.jobs's index `like` on `table` (LIKE names copies by their columns): the one
    whose definition from USING on is the same."""
    rows = conn.execute(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass "
        "AND split_part(pg_get_indexdef(i.indexrelid), ' USING ', 2) = "
        "    split_part(pg_get_indexdef(%s::regclass), ' USING ', 2)",
        (table, f"taskq.{like}"),
    ).fetchall()
    if len(rows) != 1:
        raise SystemExit(f"{len(rows)} copies of {like} on {table}")
    return f"anat.{rows[0][0]}"


def undomain(conn: psycopg.Connection[Any], table: str, *, keep_checks: bool) -> None:
    """Each column of `table` typed by a domain is retyped to the domain's base type (its collation kept); with
    `keep_checks`, the domain's checks become the table's, under their own names (the form before schema 21)."""
    columns = conn.execute(
        "SELECT a.attname, format_type(t.typbasetype, t.typtypmod), t.oid, "
        "       CASE WHEN a.attcollation NOT IN (0, t.typcollation) THEN quote_ident(co.collname) END "
        "FROM pg_attribute AS a JOIN pg_type AS t ON t.oid = a.atttypid AND t.typtype = 'd' "
        "LEFT JOIN pg_collation AS co ON co.oid = a.attcollation "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped", (table,)).fetchall()
    for column, base, domain, collation in columns:
        checks = conn.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE contypid = %s",
                              (domain,)).fetchall()
        conn.execute(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {base}"
                     + (f" COLLATE {collation}" if collation else ""))
        for name, definition in checks if keep_checks else ():
            check = re.sub(r"\bVALUE\b", column, definition.removesuffix(" NOT VALID"))
            conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {check}')


def build(dsn: str) -> list[Variant]:
    """The copies, each pruned a step further than the one before."""
    insert = sql.query("job_insert")
    variants = [Variant("taskq.jobs", "taskq.jobs", insert),
                Variant("+ notify", "taskq.jobs", insert, notify=True)]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA anat")
        conn.execute("CREATE TABLE anat.lean (id uuid PRIMARY KEY, payload jsonb NOT NULL)")
        dropped: list[str] = []
        steps: list[tuple[str, list[str]]] = [("copy", []), *CUMULATIVE_DROPS, ("- partial indexes", ["*partial"]),
                                               ("- checks", ["*checks"])]
        for n, (name, drops) in enumerate(steps):
            table = f"anat.c{n}"
            conn.execute(f"CREATE TABLE {table} (LIKE taskq.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                         "INCLUDING INDEXES INCLUDING GENERATED)")
            dropped += drops
            for what in dropped:
                if what == "*partial":
                    for (index,) in conn.execute(
                            "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                            "WHERE i.indrelid = %s::regclass AND NOT i.indisprimary", (table,)).fetchall():
                        conn.execute(f"DROP INDEX anat.{index}")
                elif what == "*checks":
                    undomain(conn, table, keep_checks=False)
                    for (check,) in conn.execute(
                            "SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'c'",
                            (table,)).fetchall():
                        conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{check}"')
                else:
                    conn.execute(f"DROP INDEX {_index_on(conn, table, what)}")
            variants.append(Variant(name, table, insert.replace("INSERT INTO taskq.jobs ", f"INSERT INTO {table} ")))
            if name == "copy":
                conn.execute("CREATE TABLE anat.checks (LIKE taskq.jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS "
                             "INCLUDING INDEXES INCLUDING GENERATED)")
                undomain(conn, "anat.checks", keep_checks=True)
                variants.append(Variant("copy, checks on the table", "anat.checks",
                                        insert.replace("INSERT INTO taskq.jobs ", "INSERT INTO anat.checks ")))
        last = variants[-1].table
        variants.append(Variant("- fair lookup", last, PLAIN_INSERT.format(table=last)))
        variants.append(Variant("lean", "anat.lean", LEAN_INSERT))
    return variants


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def measure(conn: psycopg.Connection[Any], pid: int, v: Variant, jobs: int) -> None:
    conn.execute(f"TRUNCATE {v.table}")
    payload = json.dumps({"url": "s3://bucket/images/00000001.png", "width": 640, "height": 480})
    base = {"actor": "bench.resize", "queue": "default", "payload": payload, "priority": 0, "tags": [],
            "max_attempts": 3, "scheduled_at": None, "schedule_to_close": None, "parent_id": None,
            "workflow_id": None, "idempotent": True, "trace_context": None, "concurrency_key": None,
            "fairness_key": None, "notify": v.notify}
    for _ in range(50):  # warm: the plan cached, the table's first pages there
        conn.execute(v.statement, base | {"id": uuid7()}, prepare=True)
    ids = [uuid7() for _ in range(jobs)]
    cpu0, t0 = _cpu(pid), time.perf_counter()
    for job_id in ids:
        conn.execute(v.statement, base | {"id": job_id}, prepare=True)
    wall, cpu = time.perf_counter() - t0, _cpu(pid) - cpu0
    v.cpu_us.append(cpu / jobs * 1e6)
    v.wall_us.append(wall / jobs * 1e6)
    if v.table == "anat.lean" or v.notify:
        return
    update = CLAIM_UPDATE.format(table=v.table)
    cpu0 = _cpu(pid)
    for job_id in ids:
        conn.execute(update, (job_id,), prepare=True)
    v.update_us.append((_cpu(pid) - cpu0) / jobs * 1e6)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--jobs", type=int, default=5000, help="inserts per variant per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help=f"default: {RESULTS_DIR}/enqueue_anatomy.json")
    args = parser.parse_args()
    info = machine()
    with bench_database(args.dsn, "anatomy") as dsn:
        server = server_facts(dsn)
        variants = build(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            pid = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
            for r in range(args.rounds):
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for v in order:
                    measure(conn, pid, v, args.jobs)
                print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    rows: list[list[str]] = []
    results: list[dict[str, Any]] = []
    previous: float | None = None
    for v in variants:
        cpu, wall = statistics.median(v.cpu_us), statistics.median(v.wall_us)
        update = statistics.median(v.update_us) if v.update_us else None
        side = v.name in ("+ notify", "copy, checks on the table")
        step: float | None = None if previous is None or side or v.name == "copy" else previous - cpu
        rows.append([v.name, f"{cpu:.1f}", "" if step is None else f"{step:+.1f}", f"{wall:.0f}",
                     "" if update is None else f"{update:.1f}"])
        results.append({"variant": v.name, "table": v.table, "pg_cpu_us": round(cpu, 2), "wall_us": round(wall, 1),
                        "saved_by_this_step_us": None if step is None else round(step, 2),
                        "rounds_pg_cpu_us": [round(x, 2) for x in v.cpu_us],
                        "update_pg_cpu_us": None if update is None else round(update, 2),
                        "rounds_update_pg_cpu_us": [round(x, 2) for x in v.update_us]})
        if not side:
            previous = cpu
    print(f"\nenqueue anatomy: {args.jobs} single-row inserts per variant, one commit each, {args.rounds} rounds; "
          f"PostgreSQL {server['version']}, synchronous_commit={server['synchronous_commit']}; "
          f"load {info['loadavg']} on {info['cpus']} CPUs")
    print_table(["variant", "PG CPU µs/insert", "less than the row above", "wall µs/insert", "PG CPU µs/UPDATE"], rows)
    report = header("enqueue_anatomy", {"jobs": args.jobs, "rounds": args.rounds}, info, server)
    print(f"wrote {write_report('enqueue_anatomy', report | {'variants': results}, args.json)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
