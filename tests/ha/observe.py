"""What the failover drill observes, kept outside the cluster: the history database, the 4 Hz prober of every
node, the count of workers listening on the primary, and readers of what the run left (see drill.py)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from cluster import OS_USER, PG_BIN, Cluster

PROBE_DB = "ha_probe"
SYSTEM_HISTORY = "host=127.0.0.1 port=5432 dbname=test user=postgres connect_timeout=2"
HISTORY_PORT = 5449
PROBE_INTERVAL = 0.25
PROBE_BUDGET = 0.8
"""A probe that takes longer than this did not succeed (a write waiting for a standby that will not come)."""
PROBE_DDL = "CREATE TABLE IF NOT EXISTS beats (id bigint GENERATED ALWAYS AS IDENTITY, node text, at timestamptz " \
            "DEFAULT clock_timestamp())"
HISTORY_DDL = """
CREATE SCHEMA IF NOT EXISTS ha;
CREATE TABLE IF NOT EXISTS ha.probes (tick double precision, node text, reachable boolean, in_recovery boolean,
                                      write_ok boolean);
CREATE TABLE IF NOT EXISTS ha.faults (n integer, kind text, started double precision, ended double precision,
                                      detail text);
CREATE TABLE IF NOT EXISTS ha.listeners (at double precision, port integer, listening integer);
"""


class HistoryServer:
    """Where the history goes: a database of its own on a server outside the cluster."""

    def __init__(self, root: Path, given: str | None) -> None:
        self.root = root
        self.given = given
        self.admin: str | None = None
        self.dbname = f"taskq_ha_{os.getpid()}_{int(time.time())}"
        self.where = ""
        self._pgdata: Path | None = None

    def start(self) -> str:
        if self.given:
            self.where = "given (--history-dsn)"
            return self.given
        if os.environ.get("TASKQ_HA_HISTORY") != "dedicated":
            with contextlib.suppress(psycopg.Error):
                with psycopg.connect(SYSTEM_HISTORY, autocommit=True) as conn:
                    conn.execute(f"CREATE DATABASE {self.dbname}")
                self.admin, self.where = SYSTEM_HISTORY, "system server 127.0.0.1:5432"
        if self.admin is None:
            self._pgdata = self.root / "history"
            self._pgdata.mkdir(parents=True)
            shutil.chown(self._pgdata, OS_USER, OS_USER)
            self._run(str(PG_BIN / "initdb"), "-A", "trust", "-U", "postgres", "-D", str(self._pgdata))
            self._run(str(PG_BIN / "pg_ctl"), "-w", "-D", str(self._pgdata), "-l", str(self._pgdata / "log"), "-o",
                      f"-c listen_addresses=127.0.0.1 -p {HISTORY_PORT} -k {self._pgdata} -c fsync=off", "start")
            self.admin = f"host=127.0.0.1 port={HISTORY_PORT} dbname=postgres user=postgres connect_timeout=2"
            with psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f"CREATE DATABASE {self.dbname}")
            self.where = f"dedicated PostgreSQL 15 on 127.0.0.1:{HISTORY_PORT}"
        return psycopg.conninfo.make_conninfo(self.admin, dbname=self.dbname)

    def _run(self, *args: str) -> None:
        with open(self.root / "history-server.out", "ab") as out:
            done = subprocess.run(args, user=OS_USER, cwd="/", stdout=out, stderr=subprocess.STDOUT, timeout=120)
        if done.returncode:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}); see {self.root / 'history-server.out'}")

    def close(self) -> None:
        if self._pgdata is not None:
            with contextlib.suppress(Exception):
                self._run(str(PG_BIN / "pg_ctl"), "-w", "-D", str(self._pgdata), "-m", "immediate", "stop")
        elif self.admin is not None:
            with contextlib.suppress(psycopg.Error), psycopg.connect(self.admin, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {self.dbname} WITH (FORCE)")


# -- the prober and the LISTEN watcher ------------------------------------------------------------------------


class Prober:
    """Every PROBE_INTERVAL, each node: reachable? in recovery? on a primary, does a one-row write commit
    within PROBE_BUDGET? A probe still hanging at the next tick counts as unreachable (a frozen or cut-off
    node), without waiting for it."""

    def __init__(self, cluster: Cluster, history_dsn: str) -> None:
        self.cluster, self.history_dsn = cluster, history_dsn
        self.rows: list[tuple[float, str, bool, bool | None, bool]] = []
        self._conns: dict[str, psycopg.AsyncConnection[Any] | None] = dict.fromkeys(cluster.nodes)
        self._pending: dict[str, asyncio.Task[tuple[float, str, bool, bool | None, bool]]] = {}
        self.flushed = 0

    async def run(self, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        flusher = loop.create_task(self._flusher(stop))
        while not stop.is_set():
            tick = time.time()
            for name in self.cluster.nodes:
                task = self._pending.get(name)
                if task is not None and not task.done():
                    self.rows.append((tick, name, False, None, False))
                    continue
                self._pending[name] = task = loop.create_task(self._probe(name, tick))
                task.add_done_callback(self._record)
            await asyncio.sleep(max(0.0, tick + PROBE_INTERVAL - time.time()))
        for task in self._pending.values():
            task.cancel()
        await asyncio.gather(*self._pending.values(), return_exceptions=True)
        for conn in self._conns.values():
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()  # a socket close: no round trip to a server that may not answer
        await flusher

    def _record(self, task: asyncio.Task[tuple[float, str, bool, bool | None, bool]]) -> None:
        if not task.cancelled():
            self.rows.append(task.result())

    async def _probe(self, name: str, tick: float) -> tuple[float, str, bool, bool | None, bool]:
        conn = self._conns[name]
        in_recovery: bool | None = None
        try:
            async with asyncio.timeout(PROBE_BUDGET):
                if conn is None or conn.closed:
                    conn = self._conns[name] = await psycopg.AsyncConnection.connect(
                        self.cluster.nodes[name].dsn(PROBE_DB), autocommit=True)
                cur = await conn.execute("SELECT pg_is_in_recovery()")
                row = await cur.fetchone()
                in_recovery = bool(row[0]) if row else None
                if in_recovery is False:
                    await conn.execute("INSERT INTO beats (node) VALUES (%s)", [name])
                    return tick, name, True, False, True
                return tick, name, True, in_recovery, False
        except Exception:
            self._conns[name] = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()  # a socket close: no round trip to a server that may not answer
            return tick, name, in_recovery is not None, in_recovery, False

    async def _flusher(self, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(self.history_dsn, autocommit=True) as conn:
            while True:
                rows, self.flushed = self.rows[self.flushed:], len(self.rows)
                if rows:
                    async with conn.cursor() as cur:
                        await cur.executemany("INSERT INTO ha.probes VALUES (%s, %s, %s, %s, %s)", rows)
                if stop.is_set() and self.flushed == len(self.rows):
                    return
                await asyncio.sleep(1.0)


async def count_listeners(dsn: str) -> tuple[int, int] | None:
    """(server port, distinct workers idle in LISTEN) on the primary the multi-host DSN reaches."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(3.0):
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                # one idle LISTEN session per worker: named `taskq-listener <worker id>`, or (older builds)
                # known by its last statement, the LISTEN or the listener's probe of itself
                cur = await conn.execute(
                    "SELECT inet_server_port(), count(*) FROM pg_stat_activity WHERE wait_event = 'ClientRead' "
                    "AND pid <> pg_backend_pid() AND (application_name LIKE 'taskq-listener %' "
                    "OR query ILIKE 'LISTEN%' OR query LIKE '%pg_listening_channels()%')")
                row = await cur.fetchone()
                if row is not None:
                    return int(row[0]), int(row[1])
    return None


# -- the fault driver ------------------------------------------------------------------------------------------


def failing_checks(chaos: dict[str, Any], per_check: int = 5) -> list[str]:
    """The checks chaos.py found violated, by name, with their first details (its JSON report's)."""
    counts = {**chaos.get("chaos_checks", {}), **chaos.get("history_checks", {})}
    invariants = chaos.get("invariants")
    if isinstance(invariants, dict):
        counts |= {f"invariant {k}": v for k, v in invariants.items()}
    details = chaos.get("details", {})
    lines = []
    for name, n in counts.items():
        if n:
            lines.append(f"check {name}: {n} violations")
            lines += [f"  {d}" for d in details.get(name.removeprefix("invariant "), [])[:per_check]]
    return lines


def self_fences(path: Path) -> list[float]:
    """When workers exited with code 12 (self-fenced), from the supervisor's log."""
    found = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            if ") exited with code 12" in line:
                with contextlib.suppress(ValueError):
                    found.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return found
