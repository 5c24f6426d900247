"""A fleet of three hosts on one PostgreSQL, one killed whole midway (the CI size of benchmarks/fleet.py).

Each host is a network namespace with its own address (as root, which CI is; plain process groups
otherwise) running `python -m taskq.supervisor` with two workers, on the run's own PostgreSQL listening on
the bridge address. Each job sleeps a second, so every host holds some until the queue runs dry. When a
third of the jobs are done and the victim host holds running jobs, it is killed whole (SIGSTOP, then
SIGKILL of the supervisor and every worker). Once PostgreSQL has closed its sessions, what it held is
final. The survivors must reclaim every job it held (their sweepers, after its leases expire), and every
job must succeed exactly once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fleet_hosts import Fleet, netns_available, wait_connections_gone
from testkit import query, wait_until

from taskq import JobsClient
from taskq.backend.migrations import migrate_dsn
from taskq.invariants import check_invariants

APPS = Path(__file__).resolve().parent.parent / "apps"
JOBS = 300
SECONDS_EACH = 1.0
WINDOWS = {"heartbeat_interval": 0.3, "lock_timeout": 2.0, "sweep_interval": 0.3, "poll_interval": 0.2,
           "concurrency": 4}


def host_args() -> list[str]:
    args = ["taskq_testapp:actors", "--workers", "2", "--no-metrics", "--ready-timeout", "60"]
    for name, value in WINDOWS.items():
        args += ["--" + name.replace("_", "-"), str(value)]
    return args


async def enqueue(dsn: str) -> None:
    async with await JobsClient.connect(dsn) as client:
        await client.enqueue_many("test.sleep", [{"seconds": SECONDS_EACH}] * JOBS)


def count(dsn: str, sql: str, *params: Any) -> int:
    return int(query(dsn, sql, *params)[0][0])


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_host_killed_whole_is_reclaimed_by_the_others_and_every_job_succeeds_once(tmp_path: Path) -> None:
    with Fleet(tmp_path, 3) as fleet:
        assert fleet.netns == netns_available()
        with psycopg.connect(fleet.admin_dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE fleet")
        dsn = fleet.dsn("fleet")
        await migrate_dsn(dsn)
        await enqueue(dsn)
        hosts = [fleet.start_host(i, host_args(), {"TASKQ_DSN": dsn, "PYTHONPATH": str(APPS)}, tmp_path)
                 for i in range(3)]
        victim = hosts[0]

        def victim_holds_jobs_a_third_in() -> bool:
            assert all(h.proc.poll() is None for h in hosts), [h.log() for h in hosts]
            held = count(dsn, "SELECT count(*) FROM taskq.jobs AS j JOIN taskq.workers AS w ON w.id = j.worker_id"
                              " WHERE j.status = 'running' AND w.pid = ANY(%s)", victim.pids())
            return held > 0 and count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") >= JOBS // 3

        await asyncio.to_thread(wait_until, victim_holds_jobs_a_third_in, 120.0)
        dead = [str(r[0]) for r in query(dsn, "SELECT id FROM taskq.workers WHERE pid = ANY(%s)", victim.pids())]
        assert len(dead) == 2
        killed = victim.kill()
        assert not victim.pids() and len(killed) >= 3  # the supervisor and its two workers at least
        await asyncio.to_thread(wait_connections_gone, dsn, dead)
        held = {r[0] for r in query(dsn, "SELECT id FROM taskq.jobs WHERE status = 'running' AND worker_id = ANY(%s)",
                                    dead)}
        assert held

        def all_succeeded() -> bool:
            assert all(h.proc.poll() is None for h in hosts[1:]), [h.log() for h in hosts[1:]]
            return count(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'") == JOBS

        await asyncio.to_thread(wait_until, all_succeeded, 180.0)
        reclaims = query(dsn, "SELECT job_id, worker_id, detail->>'swept_by', to_status FROM taskq.job_events"
                              " WHERE from_status = 'running' AND worker_id = ANY(%s) AND to_status <> 'succeeded'",
                         dead)
        once = count(dsn, "SELECT count(*) FROM (SELECT 1 FROM taskq.job_events WHERE to_status = 'succeeded'"
                          " GROUP BY job_id HAVING count(*) = 1) AS t")
        live = {str(r[0]) for r in query(dsn, "SELECT id FROM taskq.workers WHERE id <> ALL(%s)", dead)}
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as aconn:
            report = await check_invariants(aconn)
        codes = fleet.stop_hosts()

    assert report.ok, report.render()
    assert {r[0] for r in reclaims} == held, "every job the dead host held, and only those, was reclaimed"
    assert {r[3] for r in reclaims} == {"scheduled"}, "a reclaimed job is retried"
    assert {r[2] for r in reclaims} <= live, "by the sweeper of a surviving host"
    assert once == JOBS, "every job succeeded exactly once (one terminal event each)"
    assert codes[1:] == [0, 0], "the survivors stop cleanly"
