"""What autovacuum does to a benchmark's taskq tables, and waits for it (history.py).

- `table_stats`: per table, live and dead tuples, vacuum counts and time, sizes;
- `settle`: after a seed, a CHECKPOINT and the end of this database's autovacuums;
- `quiesce`: before a measured leg, until autovacuum has caught up with the dead rows of `taskq.jobs`
  on every database given and no vacuum runs on the server;
- `VacuumWatch`: which tables of which databases were being vacuumed during a leg.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

TABLES_SQL = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, vacuum_count,
       pg_total_relation_size(relid), pg_indexes_size(relid), {autovacuum_ms}
FROM pg_stat_user_tables WHERE schemaname = 'taskq' AND relname IN ('jobs', 'job_events', 'job_attempts')
ORDER BY relname
"""
AUTOVACUUM_WORKERS_SQL = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'"
JOBS_VACUUM_THRESHOLD_SQL = """
SELECT coalesce((SELECT option_value::int
                 FROM pg_options_to_table((SELECT reloptions FROM pg_class WHERE oid = 'taskq.jobs'::regclass))
                 WHERE option_name = 'autovacuum_vacuum_threshold'),
                current_setting('autovacuum_vacuum_threshold')::int)
"""
"""Dead rows of taskq.jobs after which autovacuum takes it: migration 14's reloption, else the server's."""


def table_stats(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """Per table; `autovacuum_s`: the time autovacuum spent on it so far, cost-delay sleeps included
    (PostgreSQL 18's total_autovacuum_time; None before 18)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    query = TABLES_SQL.format(autovacuum_ms="total_autovacuum_time" if conn.info.server_version >= 180000
                              else "NULL::float8")
    return {
        str(r[0]): {"live": int(r[1]), "dead": int(r[2]), "autovacuums": int(r[3]), "autoanalyzes": int(r[4]),
                    "vacuums": int(r[5]), "total_bytes": int(r[6]), "index_bytes": int(r[7]),
                    "autovacuum_s": None if r[8] is None else float(r[8]) / 1000}
        for r in conn.execute(query).fetchall()
    }


def autovacuum_workers(conn: psycopg.Connection[Any], *, this_database: bool = False) -> int:
    """Autovacuum workers running now, on the server or (`this_database`) on the connection's database."""
    query = AUTOVACUUM_WORKERS_SQL + (" AND datname = current_database()" if this_database else "")
    return int((conn.execute(query).fetchone() or (0,))[0])


def settle(dsn: str, timeout: float = 600.0) -> None:
    """After a seed: flush its dirty pages (CHECKPOINT) and wait for any autovacuum of this database to end,
    so that the rounds do not pay for the seed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and autovacuum_workers(conn, this_database=True):
            time.sleep(1.0)


def quiesce(dsns: list[str], timeout: float = 300.0) -> dict[str, Any]:
    """Before a latency leg: wait until autovacuum has caught up with the drains just run (on every database,
    `taskq.jobs` has fewer dead rows than its vacuum threshold) and no autovacuum worker runs on the
    server. The leg then measures the hot path at light load, where a vacuum of `taskq.jobs` comes once
    per threshold's worth of jobs (10,000 dead rows: ~100 s at 50 jobs/s), not the vacuums that the
    benchmark's own 40,000-job drains set off on every level at once. Those vacuums are measured too:
    the drains' `autovacuum_s`, and the tables' autovacuum time at the end."""
    started = time.monotonic()
    conns = [psycopg.connect(dsn, autocommit=True) for dsn in dsns]
    try:
        thresholds = [int((conn.execute(JOBS_VACUUM_THRESHOLD_SQL).fetchone() or (50,))[0]) for conn in conns]
        while True:
            dead = [table_stats(conn)["jobs"]["dead"] for conn in conns]
            workers = autovacuum_workers(conns[0])
            settled = workers == 0 and all(d < t for d, t in zip(dead, thresholds, strict=True))
            if settled or time.monotonic() > started + timeout:
                return {"waited_s": time.monotonic() - started, "settled": settled, "jobs_dead": dead,
                        "autovacuum_workers": workers}
            time.sleep(1.0)
    finally:
        for conn in conns:
            conn.close()


class VacuumWatch:
    """The vacuums that ran during a leg, on any database of the server: pg_stat_progress_vacuum sampled
    every `every` seconds, counted per "database table" in `seen` (the database without its taskq_bench_
    prefix; the table named at exit, one look-up per database). On two cores the vacuum of one level's
    big history tables competes with the leg it overlaps."""

    SQL = "SELECT datname, relid FROM pg_stat_progress_vacuum"

    def __init__(self, dsn: str, every: float = 0.25) -> None:
        self.dsn, self.every = dsn, every
        self.seen: dict[str, int] = {}
        self._counts: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> VacuumWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for datname in {d for d, _ in self._counts}:
            relids = [r for d, r in self._counts if d == datname]
            names = self._names(datname, relids)
            for relid in relids:
                key = f"{datname.removeprefix('taskq_bench_')} {names.get(relid, relid)}"
                self.seen[key] = self._counts[(datname, relid)]

    def _sample(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self._stop.wait(self.every):
                for datname, relid in conn.execute(self.SQL).fetchall():
                    key = (str(datname), int(relid))
                    self._counts[key] = self._counts.get(key, 0) + 1

    def _names(self, datname: str, relids: list[int]) -> dict[int, str]:
        """Table names by oid, looked up in their own database (gone already: the oids stay bare)."""
        try:
            with psycopg.connect(make_conninfo(self.dsn, dbname=datname), autocommit=True) as conn:
                rows = conn.execute("SELECT oid::int8, oid::regclass::text FROM pg_class WHERE oid = ANY(%s::oid[])",
                                    (relids,)).fetchall()
        except psycopg.Error:
            return {}
        return {int(r[0]): str(r[1]) for r in rows}
