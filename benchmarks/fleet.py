"""A fleet on one PostgreSQL: throughput by host count, PostgreSQL CPU per job, and a whole host killed.

    python benchmarks/fleet.py [--hosts 1,2,3] [--workers-per-host 1] [--jobs 100000] [--rounds 2]
                               [--kill-jobs 100000] [--kill-sleep 0.02] [--no-netns] [--json out.json]

A host is a network namespace (`ip netns add`, a veth into a bridge; root needed, else `--no-netns` or
automatically plain process groups on loopback) running one supervisor (`python -m taskq.supervisor
benchmarks.apps:actors --workers N`) with its workers. The PostgreSQL is the run's own (started like the
embedded one, then restarted listening on the bridge address; never the shared server), so its whole CPU
(the postmaster and every child, from /proc) is the fleet's. Harness: tests/chaos/fleet_hosts.py.

1. Throughput: per round and host count (rotated), `--jobs` no-op jobs enqueued with `enqueue_many`, then
   the hosts started together; jobs/s = jobs / (max(finished_at) - min(started_at)); PostgreSQL CPU and
   the hosts' CPU per job over the drain (a window from the hosts' start, their boot included).
2. Host kill: `--kill-jobs` jobs of `bench.sleep` (`--kill-sleep` seconds each, so that a host holds jobs
   when it dies) on all the hosts; when half are done, one host is killed whole (SIGSTOP then SIGKILL of
   its supervisor and every worker, at once). Then: every job succeeded, the invariant checker
   (`taskq.invariants`) finds nothing, every job the dead host held is reclaimed by a surviving host's
   sweeper, and the time from the kill to each reclaim against `lock_timeout + sweep_interval`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
from _common import (
    BENCH_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    ServerCpu,
    cpu_seconds,
    header,
    machine,
    print_table,
    reset_jobs,
    server_facts,
    write_report,
)
from apps import NOOP, SLEEP, registry
from psycopg import sql as pgsql

sys.path.insert(0, str(BENCH_DIR.parent / "tests" / "chaos"))
from fleet_hosts import Fleet, Host, wait_connections_gone

from taskq.backend.migrations import migrate_dsn
from taskq.client import JobsClient
from taskq.invariants import check_invariants

APP = "benchmarks.apps:actors"
POLL_INTERVAL = 0.25
DB_NAME = "taskq_fleet"

# polled: partial-index counts only (jobs_claim_idx, jobs_running_lease_idx), never a scan of the table
UNFINISHED_SQL = """
SELECT (SELECT count(*) FROM taskq.jobs WHERE status IN ('pending', 'scheduled'))
       + (SELECT count(*) FROM taskq.jobs WHERE status = 'running')
"""
COUNTS_SQL = """
SELECT count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status IN ('pending', 'scheduled',
       'running')), count(*) FILTER (WHERE status NOT IN ('pending', 'scheduled', 'running', 'succeeded'))
FROM taskq.jobs
"""
DRAIN_SQL = """
SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM taskq.jobs WHERE status = 'succeeded'
"""
CONNECTIONS_SQL = """
SELECT coalesce(host(client_addr), 'local'), count(*) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() GROUP BY 1
"""
RECLAIMS_SQL = """
SELECT e.job_id, extract(epoch FROM e.at - %(killed_at)s), e.detail->>'swept_by', e.to_status
FROM taskq.job_events AS e
WHERE e.from_status = 'running' AND e.worker_id = ANY(%(dead)s) AND e.at >= %(killed_at)s
"""


def host_args(args: argparse.Namespace) -> list[str]:
    flags = [APP, "--workers", str(args.workers_per_host), "--no-metrics",
             "--concurrency", str(args.concurrency), "--claim-batch-size", str(args.claim_batch_size),
             "--heartbeat-interval", str(args.heartbeat_interval), "--lock-timeout", str(args.lock_timeout),
             "--sweep-interval", str(args.sweep_interval)]
    return flags


def start_hosts(fleet: Fleet, count: int, args: argparse.Namespace, dsn: str) -> list[Host]:
    return [fleet.start_host(i, host_args(args), {"TASKQ_DSN": dsn}, REPO_ROOT) for i in range(count)]


async def enqueue(dsn: str, actor: str, payloads: list[Any], batch: int = 5_000) -> None:
    client = await JobsClient.connect(dsn, registry=registry)
    try:
        for first in range(0, len(payloads), batch):
            await client.enqueue_many(actor, payloads[first:first + batch])
    finally:
        await client.close()


def unfinished(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(UNFINISHED_SQL).fetchone()
    assert row is not None
    return int(row[0])


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = conn.execute(COUNTS_SQL).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def wait_drained(conn: psycopg.Connection[Any], hosts: list[Host], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while unfinished(conn) > 0:
        if any(h.proc.poll() is not None for h in hosts):
            raise RuntimeError(f"a supervisor exited early; see {[str(h.log_path) for h in hosts]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained after {timeout:.0f}s")
        time.sleep(POLL_INTERVAL)


def hosts_cpu(hosts: list[Host], known: dict[int, float]) -> float:
    """CPU seconds of every process of these hosts; `known` keeps the last reading of a pid (one that has
    exited by the end counts with its last reading)."""
    for h in hosts:
        for pid in h.pids():
            cpu = cpu_seconds(pid)
            if cpu is not None:
                known[pid] = cpu
    return sum(known.values())


def throughput_leg(fleet: Fleet, dsn: str, count: int, args: argparse.Namespace, server: ServerCpu) -> dict[str, Any]:
    reset_jobs(dsn)
    asyncio.run(enqueue(dsn, NOOP, list(range(args.jobs))))
    load = machine()["loadavg"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE taskq.jobs")
        pg0 = server.everything() or 0.0
        t0 = time.perf_counter()
        hosts = start_hosts(fleet, count, args, dsn)
        known: dict[int, float] = {}
        connections: dict[str, int] = {}
        try:
            while unfinished(conn) > 0:
                hosts_cpu(hosts, known)
                for addr, n in conn.execute(CONNECTIONS_SQL).fetchall():
                    connections[str(addr)] = max(connections.get(str(addr), 0), int(n))
                wait_drained_step(conn, hosts, t0, args.timeout)
            wall = time.perf_counter() - t0
            pg1 = server.everything() or 0.0
            host_s = hosts_cpu(hosts, known)
        finally:
            fleet.stop_hosts()
        done, drain_s = conn.execute(DRAIN_SQL).fetchone() or (0, None)
        (workers,) = conn.execute("SELECT count(DISTINCT worker_id) FROM taskq.job_attempts").fetchone() or (0,)
    return {"hosts": count, "loadavg_before": load, "succeeded": int(done), "drain_s": float(drain_s or 0),
            "jobs_per_s": int(done) / float(drain_s) if drain_s else None,
            "pg_cpu_us_per_job": 1e6 * (pg1 - pg0) / max(1, int(done)),
            "pg_cores": (pg1 - pg0) / wall,
            "hosts_cpu_us_per_job": 1e6 * host_s / max(1, int(done)),
            "workers_seen": int(workers), "max_connections_by_address": connections}


def wait_drained_step(conn: psycopg.Connection[Any], hosts: list[Host], t0: float, timeout: float) -> None:
    if any(h.proc.poll() is not None for h in hosts):
        raise RuntimeError(f"a supervisor exited early; see {[str(h.log_path) for h in hosts]}")
    if time.perf_counter() - t0 > timeout:
        raise RuntimeError(f"not drained after {timeout:.0f}s")
    time.sleep(POLL_INTERVAL)


def kill_leg(fleet: Fleet, dsn: str, args: argparse.Namespace) -> dict[str, Any]:
    reset_jobs(dsn)
    asyncio.run(enqueue(dsn, SLEEP, [args.kill_sleep] * args.kill_jobs))
    load = machine()["loadavg"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        hosts = start_hosts(fleet, fleet.size, args, dsn)
        victim = hosts[0]
        try:
            t0 = time.perf_counter()
            while True:
                done = args.kill_jobs - unfinished(conn)
                victim_pids = victim.pids()
                held = conn.execute(
                    "SELECT count(*) FROM taskq.jobs AS j JOIN taskq.workers AS w ON w.id = j.worker_id"
                    " WHERE j.status = 'running' AND w.pid = ANY(%s)", (victim_pids,)).fetchone()
                if done >= args.kill_jobs // 2 and held and int(held[0]) > 0:
                    break
                wait_drained_step(conn, hosts, t0, args.timeout)
            dead_ids = [str(r[0]) for r in conn.execute(
                "SELECT id FROM taskq.workers WHERE pid = ANY(%s)", (victim_pids,)).fetchall()]
            killed = victim.kill()
            row = conn.execute("SELECT now()").fetchone()
            assert row is not None
            killed_at = row[0]
            wait_connections_gone(dsn, dead_ids)
            held_rows = {r[0] for r in conn.execute(
                "SELECT id FROM taskq.jobs WHERE status = 'running' AND worker_id = ANY(%s)", (dead_ids,)).fetchall()}
            done_at_kill = args.kill_jobs - unfinished(conn)
            survivors = [h for h in hosts if h is not victim]
            wait_drained(conn, survivors, args.timeout)
            reclaims = conn.execute(RECLAIMS_SQL, {"killed_at": killed_at, "dead": dead_ids}).fetchall()
            missed = sorted(held_rows - {r[0] for r in reclaims})[:3]
            missed_events = [[str(v) for v in e] for e in conn.execute(
                "SELECT job_id, id, at, kind, from_status, to_status, worker_id, detail FROM taskq.job_events"
                " WHERE job_id = ANY(%s) ORDER BY job_id, id", (missed,)).fetchall()]
            succeeded, left, other = counts(conn)
            (once,) = conn.execute(
                "SELECT count(*) FROM (SELECT job_id FROM taskq.job_events WHERE to_status = 'succeeded'"
                " GROUP BY job_id HAVING count(*) = 1) AS t").fetchone() or (0,)
        finally:
            fleet.stop_hosts()
    invariants = asyncio.run(invariant_report(dsn))
    reclaimed = {r[0] for r in reclaims}
    delays = [float(r[1]) for r in reclaims]
    bound = args.lock_timeout + args.sweep_interval
    return {
        "loadavg_before": load, "jobs": args.kill_jobs, "sleep_s": args.kill_sleep,
        "done_at_kill": done_at_kill, "killed_pids": killed, "dead_workers": dead_ids,
        "held_by_dead_host": len(held_rows), "not_reclaimed_sample": missed_events,
        "reclaimed": len(reclaimed & held_rows),
        "reclaimed_by": sorted({str(r[2]) for r in reclaims}),
        "reclaim_statuses": sorted({str(r[3]) for r in reclaims}),
        "reclaim_s": {"min": min(delays, default=float("nan")), "max": max(delays, default=float("nan")),
                      "median": statistics.median(delays) if delays else float("nan")},
        "bound_s": bound, "within_bound": bool(delays) and max(delays) <= bound,
        "succeeded": succeeded, "unfinished": left, "other_terminal": other,
        "succeeded_exactly_once": int(once), "invariant_violations": len(invariants.violations),
        "invariants": invariants.render(),
        "ok": (succeeded == args.kill_jobs and int(once) == args.kill_jobs and not invariants.violations
               and held_rows <= reclaimed),
    }


async def invariant_report(dsn: str) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        # the leg began with emptied tables (statistics of empty tables): without fresh ones the checker's
        # joins of 100,000 jobs with their timelines are planned as nested loops and run for hours
        await conn.execute("ANALYZE taskq.jobs, taskq.job_events, taskq.job_attempts")
        return await check_invariants(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,3", help="host counts for the throughput legs")
    parser.add_argument("--workers-per-host", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=100_000, help="no-op jobs per throughput leg")
    parser.add_argument("--rounds", type=int, default=2, help="throughput rounds (host counts rotate); medians")
    parser.add_argument("--kill-jobs", type=int, default=100_000, help="jobs of the host-kill leg")
    parser.add_argument("--kill-sleep", type=float, default=0.02, help="seconds each job of the kill leg sleeps")
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--claim-batch-size", type=int, default=200)
    parser.add_argument("--heartbeat-interval", type=float, default=1.0)
    parser.add_argument("--lock-timeout", type=float, default=5.0)
    parser.add_argument("--sweep-interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--no-netns", action="store_true", help="hosts as process groups, not namespaces")
    parser.add_argument("--json", type=Path, default=RESULTS_DIR / "fleet.json")
    args = parser.parse_args()
    counts_list = [int(h) for h in args.hosts.split(",")]
    size = max([*counts_list, 3])
    params = {k: v for k, v in vars(args).items() if k != "json"}
    info = machine()
    with tempfile.TemporaryDirectory(prefix="taskq-fleet-") as tmp, Fleet(Path(tmp), size,
                                                                         netns=not args.no_netns) as fleet:
        with psycopg.connect(fleet.admin_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(DB_NAME)))
        dsn = fleet.dsn(DB_NAME)
        asyncio.run(migrate_dsn(dsn))
        server_info = server_facts(dsn) | {"address": fleet.server_address, "netns": fleet.netns}
        print(f"fleet: {params}\nmachine: {info}; server {server_info}", file=sys.stderr)
        server = ServerCpu(dsn)
        legs: dict[int, list[dict[str, Any]]] = {n: [] for n in counts_list}
        try:
            for r in range(args.rounds):
                order = counts_list[r % len(counts_list):] + counts_list[:r % len(counts_list)]
                for n in order:
                    leg = throughput_leg(fleet, dsn, n, args, server)
                    legs[n].append(leg)
                    print(f"  round {r + 1}, {n} host(s): {leg['jobs_per_s']:,.0f} jobs/s, PG "
                          f"{leg['pg_cpu_us_per_job']:.0f} µs/job ({leg['pg_cores']:.2f} cores), hosts "
                          f"{leg['hosts_cpu_us_per_job']:.0f} µs/job (load {leg['loadavg_before']})", file=sys.stderr)
        finally:
            server.close()
        kill = kill_leg(fleet, dsn, args) if args.kill_jobs else None
    summary = {n: {"jobs_per_s": statistics.median(x["jobs_per_s"] for x in ls),
                   "rounds": [x["jobs_per_s"] for x in ls],
                   "pg_cpu_us_per_job": statistics.median(x["pg_cpu_us_per_job"] for x in ls),
                   "pg_cores": statistics.median(x["pg_cores"] for x in ls),
                   "hosts_cpu_us_per_job": statistics.median(x["hosts_cpu_us_per_job"] for x in ls),
                   "loadavg_before": [x["loadavg_before"][0] for x in ls]}
               for n, ls in legs.items() if ls}
    report = header("fleet", params, info, server_info) | {"machine_after": machine(), "summary": summary,
                                                           "legs": {str(n): ls for n, ls in legs.items()}, "kill": kill}
    print(f"\nfleet: {args.jobs:,} no-op jobs per leg, {args.workers_per_host} worker(s) per host "
          f"({'network namespaces' if fleet.netns else 'process groups'}), load average at start {info['loadavg']}, "
          f"after {report['machine_after']['loadavg']} on {info['cpus']} CPUs")
    print_table(["hosts", "jobs/s", "rounds", "PG µs/job", "PG cores", "hosts µs/job", "load before"],
                [[n, s["jobs_per_s"], " / ".join(f"{x:,.0f}" for x in s["rounds"]), s["pg_cpu_us_per_job"],
                  s["pg_cores"], s["hosts_cpu_us_per_job"], " / ".join(f"{x:.2f}" for x in s["loadavg_before"])]
                 for n, s in summary.items()])
    if kill is not None:
        print(f"\nhost kill: {kill['jobs']:,} jobs of {kill['sleep_s']} s on {size} hosts, host0 killed "
              f"(kill -9 of {len(kill['killed_pids'])} processes) at {kill['done_at_kill']:,} done, holding "
              f"{kill['held_by_dead_host']} running jobs")
        print_table(["check", "result"], [
            ["succeeded", f"{kill['succeeded']:,} / {kill['jobs']:,}"],
            ["succeeded exactly once (one terminal event)", f"{kill['succeeded_exactly_once']:,}"],
            ["invariant violations", kill["invariant_violations"]],
            ["dead host's jobs reclaimed", f"{kill['reclaimed']} / {kill['held_by_dead_host']}"],
            ["reclaimed by", ", ".join(kill["reclaimed_by"])],
            ["kill → reclaim s (min / median / max)",
             f"{kill['reclaim_s']['min']:.2f} / {kill['reclaim_s']['median']:.2f} / {kill['reclaim_s']['max']:.2f}"],
            ["bound lock_timeout + sweep_interval s",
             f"{kill['bound_s']:.1f} ({'met' if kill['within_bound'] else 'MISSED'})"],
            ["verdict", "ok" if kill["ok"] else "FAILED"],
        ])
    print(f"wrote {write_report('fleet', report, args.json)}")


if __name__ == "__main__":
    main()
