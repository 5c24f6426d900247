"""The supervisor as a real process tree: `python -m taskq.supervisor`, real signals, a real PostgreSQL,
and this test bound to the NOTIFY_SOCKET in systemd's place."""

from __future__ import annotations

import itertools
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit import insert_job as enqueue
from testkit import query, wait_until

from taskq.supervisor.restart import CRASH_LOOP
from taskq.worker import exitcodes

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

APPS = str(Path(__file__).resolve().parent.parent / "apps")
APP = "taskq_supervisor_app:actors"
WINDOWS: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "lock_timeout": 1.0,
    "poll_interval": 0.2,
    "sweep_interval": 0.3,
    "cancellation_grace_period": 0.5,
    "cleanup_grace_period": 0.5,
    "worker_timeout": 5.0,
    "metrics_port": 0,
}
SUPERVISOR_FLAGS = ["--kill-grace", "2", "--stop-margin", "2", "--restart-backoff", "0.1"]


# -- helpers ---------------------------------------------------------------------------------------


class NotifyListener:
    """What systemd would receive: the datagrams sent to NOTIFY_SOCKET (an abstract '@' name here)."""

    def __init__(self) -> None:
        self.name = f"@taskq-test-{uuid.uuid4().hex}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + self.name[1:])
        self.sock.setblocking(False)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def drain(self, wait: float = 0.0) -> None:
        if wait and not select.select([self.sock], [], [], wait)[0]:
            return
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.monotonic(), fields))

    def wait_for(
        self, key: str, value: str = "1", timeout: float = 20.0, after: float = 0.0
    ) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while True:
            for at, fields in self.messages:
                if at >= after and fields.get(key) == value:
                    return fields
            if time.monotonic() > deadline:
                raise AssertionError(f"no {key}={value} within {timeout}s; got {self.messages[-10:]}")
            self.drain(wait=0.05)

    def times(self, key: str) -> list[float]:
        self.drain()
        return [at for at, fields in self.messages if key in fields]

    def close(self) -> None:
        self.sock.close()


def alive(pid: int) -> bool:
    """Running (not a zombie, not gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> str:
    """The process's command line; "" once it has exited (a worker leaving between the listing of the
    supervisor's children and this read, as the one SIGTTOU stops does)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


class Supervisor:
    def __init__(
        self, proc: subprocess.Popen[bytes], log_path: Path, dsn: str, notify: NotifyListener
    ) -> None:
        self.proc = proc
        self.log_path = log_path
        self.dsn = dsn
        self.notify = notify
        self.seen_pids: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def registered(self) -> dict[int, str]:
        """pid -> worker id of every registered worker (any host is this host here)."""
        rows = query(self.dsn, "SELECT pid, id FROM taskq.workers")
        pids = {int(pid): str(wid) for pid, wid in rows}
        self.seen_pids |= set(pids)
        return pids

    def wait_registered(
        self, n: int, timeout: float = 20.0, exclude: frozenset[int] = frozenset()
    ) -> dict[int, str]:
        def check() -> dict[int, str] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"supervisor exited with {self.proc.returncode}:\n{self.log()}")
            pids = {p: w for p, w in self.registered().items() if p not in exclude}
            return pids if len(pids) == n else None

        found: dict[int, str] = wait_until(check, timeout=timeout)
        return found

    def workers(self) -> list[int]:
        return [pid for pid in children(self.pid) if cmdline(pid).startswith("taskq worker")]

    def metrics_url(self, path: str = "/metrics") -> str:
        match = wait_until(lambda: re.search(r"metrics endpoint on http://([\d.]+:\d+)/metrics", self.log()))
        return f"http://{match.group(1)}{path}"

    def signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"supervisor still running after {timeout}s:\n{self.log()}") from None


@pytest.fixture
def start_supervisor(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def start(
        app: str = APP, workers: int = 2, *, flags: tuple[str, ...] = (), env: dict[str, str] | None = None,
        **settings: Any,
    ) -> Supervisor:
        args = [sys.executable, "-m", "taskq.supervisor", app, "--workers", str(workers),
                *SUPERVISOR_FLAGS, *flags]
        for name, value in (WINDOWS | settings).items():
            args += ["--" + name.replace("_", "-"), str(value)]
        notify = NotifyListener()
        full_env = os.environ | {"TASKQ_DSN": dsn, "PYTHONPATH": APPS, "NOTIFY_SOCKET": notify.name}
        full_env |= env or {}
        log_path = tmp_path / f"supervisor-{len(started)}.log"
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(args, env=full_env, stdout=log_file, stderr=subprocess.STDOUT)
        sup = Supervisor(proc, log_path, dsn, notify)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        family = children(sup.pid) if sup.proc.poll() is None else []
        if sup.proc.poll() is None:
            sup.proc.terminate()  # a graceful stop, so the supervisor removes its metrics directory
            try:
                sup.proc.wait(20)
            except subprocess.TimeoutExpired:
                sup.proc.kill()
                sup.proc.wait(10)
        for pid in family + list(sup.seen_pids):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        sup.notify.close()




def job(dsn: str, job_id: UUID) -> dict[str, Any]:
    (row,) = query(dsn, "SELECT status, attempt, worker_id, error_class, interrupt_count FROM taskq.jobs "
                        "WHERE id = %s", job_id)
    return dict(zip(("status", "attempt", "worker_id", "error_class", "interrupt_count"), row, strict=True))


def attempts(dsn: str, job_id: UUID) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT attempt, outcome, error_class, error_message FROM taskq.job_attempts "
                      "WHERE job_id = %s ORDER BY claim_epoch", job_id)


def reclaim_causes(dsn: str, job_id: UUID) -> list[str]:
    rows = query(dsn, "SELECT detail->>'cause' FROM taskq.job_events WHERE job_id = %s AND detail ? 'cause' "
                      "ORDER BY id", job_id)
    return [r[0] for r in rows]


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


# -- start, ready, stop ----------------------------------------------------------------------------


def test_ready_arrives_once_every_worker_registered_and_jobs_run(start_supervisor: Any, dsn: str) -> None:
    sup = start_supervisor(env={"WATCHDOG_USEC": "400000"})
    sup.notify.wait_for("READY")
    assert len(sup.registered()) == 2, "READY=1 came before both workers registered"
    ids = [enqueue(dsn, "test.noop", i) for i in range(20)]
    wait_until(lambda: all(job(dsn, i)["status"] == "succeeded" for i in ids))
    wait_until(lambda: len(sup.notify.times("WATCHDOG")) >= 3, timeout=5)
    statuses = [f["STATUS"] for _, f in sup.notify.messages if "STATUS" in f]
    assert any(s.startswith("2 workers (2 ready)") for s in statuses), statuses
    sup.signal(signal.SIGTERM)
    sup.notify.wait_for("STOPPING")
    assert sup.wait(20) == exitcodes.OK
    assert not [pid for pid in sup.seen_pids if alive(pid)]
    assert sup.registered() == {}


def test_sigterm_releases_in_flight_job_and_exits_zero_leaving_no_process(
    start_supervisor: Any, dsn: str
) -> None:
    sup = start_supervisor()
    sup.notify.wait_for("READY")
    family = children(sup.pid)
    assert len(family) == 3  # two workers and the metrics helper
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["status"] == "running")
    sup.signal(signal.SIGTERM)
    sup.notify.wait_for("STOPPING")
    assert sup.wait(20) == exitcodes.OK
    row = job(dsn, job_id)
    assert (row["status"], row["attempt"], row["interrupt_count"]) == ("pending", 1, 1)
    assert [a[1] for a in attempts(dsn, job_id)] == ["interrupted"]
    assert not [pid for pid in family if alive(pid)]


def test_unimportable_app_exits_with_import_error_without_forking(start_supervisor: Any) -> None:
    sup = start_supervisor("no_such_module_anywhere:actors")
    assert sup.wait(20) == exitcodes.IMPORT_ERROR
    assert "taskq: error: cannot import 'no_such_module_anywhere'" in sup.log()
    assert "spawned worker" not in sup.log()


def test_without_preload_an_unimportable_app_fails_in_the_workers_and_stops_the_supervisor(
    start_supervisor: Any,
) -> None:
    sup = start_supervisor("no_such_module_anywhere:actors", flags=("--no-preload",))
    assert sup.wait(20) == exitcodes.IMPORT_ERROR
    assert sup.log().count("spawned worker") == 2, sup.log()
    assert "cannot import 'no_such_module_anywhere'" in sup.log()


def _pending_signals(pid: int) -> int:
    """The process-wide pending signals of `pid` (ShdPnd of /proc/PID/status), as a bit mask."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        raise AssertionError(f"worker {pid} is gone: the stop killed it before it handled signals") from None
    for line in status.splitlines():
        if line.startswith("ShdPnd:"):
            return int(line.split()[1], 16)
    return 0


def test_a_worker_stopped_while_it_starts_stops_cleanly_once_it_handles_the_signal(
    start_supervisor: Any, tmp_path: Path
) -> None:
    """A SIGTERM that reaches a worker child before its event loop handles it (here the child is held in
    its APP import, with --no-preload; in the chaos run, a rolling restart's new worker stopped at once)
    waits, blocked, until the handler exists: the worker stops cleanly and the supervisor exits 0. Before,
    SIGTERM's default action killed the child, and the supervisor exited 1 for it."""
    gate, importing = tmp_path / "gate", tmp_path / "importing"
    sup = start_supervisor("taskq_gated_app:actors", workers=1, flags=("--no-preload",),
                           env={"TASKQ_TEST_GATE": str(gate), "TASKQ_TEST_IMPORTING": str(importing)})
    wait_until(importing.exists)
    (pid,) = wait_until(sup.workers)
    sup.signal(signal.SIGTERM)
    # the supervisor passes the stop on; the child holds it pending (bit 15 - 1: SIGTERM)
    wait_until(lambda: _pending_signals(pid) & (1 << (signal.SIGTERM - 1)), timeout=10)
    gate.write_text("go")
    assert sup.wait(30) == exitcodes.OK, sup.log()
    assert "killed by" not in sup.log(), sup.log()


def test_workers_failing_at_boot_stop_the_supervisor_without_a_restart_loop(start_supervisor: Any) -> None:
    sup = start_supervisor(env={"TASKQ_DSN": "host=/nonexistent-taskq-dir port=1 dbname=x user=postgres"})
    assert sup.wait(20) == exitcodes.DATABASE_UNAVAILABLE
    assert sup.log().count("spawned worker") == 2, sup.log()
    assert "restarting cannot fix this" in sup.log()


def test_crash_loop_stops_the_supervisor_non_zero(start_supervisor: Any, dsn: str) -> None:
    for _ in range(4):
        enqueue(dsn, "test.kill_worker", 1, max_attempts=10)
    sup = start_supervisor(flags=("--crash-limit", "3", "--crash-window", "60"))
    assert sup.wait(30) == CRASH_LOOP
    assert "crash loop" in sup.log()
    assert not [pid for pid in sup.seen_pids | set(children(sup.pid)) if alive(pid)]


# -- deaths and liveness ---------------------------------------------------------------------------


def test_killed_worker_is_replaced_and_its_job_reclaimed_at_once(start_supervisor: Any, dsn: str,
                                                                 tmp_path: Path) -> None:
    sup = start_supervisor(lock_timeout=30, heartbeat_interval=1, sweep_interval=30)
    sup.notify.wait_for("READY")
    job_id = enqueue(dsn, "test.gated", {"path": str(tmp_path / "never-opened")})
    wait_until(lambda: job(dsn, job_id)["status"] == "running")
    holder = next(pid for pid, wid in sup.registered().items() if wid == job(dsn, job_id)["worker_id"])
    os.kill(holder, signal.SIGKILL)
    killed_at = time.monotonic()
    wait_until(lambda: reclaim_causes(dsn, job_id) == ["worker_died"], timeout=10)
    reclaimed_after = time.monotonic() - killed_at
    # attempt 2 does not wait for the gate; its claim waits out the retry backoff (1 s)
    wait_until(lambda: job(dsn, job_id)["status"] == "succeeded", timeout=15)
    assert reclaimed_after < 5, f"reclaimed {reclaimed_after:.1f}s after the kill; lock_timeout is 30 s"
    (first, second) = attempts(dsn, job_id)
    assert first[:3] == (1, "crashed", "WorkerCrashed")
    assert "worker_died" in first[3] and "SIGKILL" in first[3]
    assert second[:2] == (2, "succeeded")
    pids = sup.wait_registered(2)
    assert holder not in pids
    _, text = http_get(sup.metrics_url())
    restarts = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert restarts["taskq_worker_restarts_total"] == 1.0


def test_worker_with_a_blocked_loop_gets_sigabrt_and_is_replaced(start_supervisor: Any, dsn: str) -> None:
    sup = start_supervisor(worker_timeout=2, lock_timeout=30, heartbeat_interval=1, sweep_interval=30)
    sup.notify.wait_for("READY")
    job_id = enqueue(dsn, "test.block_loop", 60.0, max_attempts=1)
    wait_until(lambda: job(dsn, job_id)["status"] == "running")
    holder = next(pid for pid, wid in sup.registered().items() if wid == job(dsn, job_id)["worker_id"])
    wait_until(lambda: job(dsn, job_id)["status"] == "crashed", timeout=15)
    assert reclaim_causes(dsn, job_id) == ["heartbeat_timeout"]
    ((_, outcome, error_class, message),) = attempts(dsn, job_id)
    assert (outcome, error_class) == ("crashed", "WorkerCrashed")
    assert "heartbeat_timeout" in message and "silent" in message and "SIGABRT" in message
    log = sup.log()
    assert "SIGABRT" in log and "Fatal Python error: Aborted" in log
    assert "block_loop" in log  # faulthandler's stack of the stuck loop
    assert not alive(holder)
    assert holder not in sup.wait_registered(2)


def test_stopped_worker_pauses_the_watchdog_until_sigkill_replaces_it(start_supervisor: Any) -> None:
    sup = start_supervisor(worker_timeout=1, env={"WATCHDOG_USEC": "200000"}, flags=("--kill-grace", "2"))
    sup.notify.wait_for("READY")
    victim = next(iter(sup.registered()))
    os.kill(victim, signal.SIGSTOP)  # SIGABRT stays pending on a stopped process: only SIGKILL works
    stopped_at = time.monotonic()
    sup.wait_registered(2, exclude=frozenset({victim}))
    wait_until(lambda: not alive(victim))
    assert "still alive 2s after SIGABRT: SIGKILL" in sup.log()
    wait_until(lambda: any(t > time.monotonic() - 0.5 for t in sup.notify.times("WATCHDOG")), timeout=5)
    pings = [t for t in sup.notify.times("WATCHDOG") if t >= stopped_at - 0.5]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert max(gaps) > 1.5, f"the watchdog kept being fed while a worker was frozen: {gaps}"


def test_supervisor_killed_outright_takes_its_workers_down(start_supervisor: Any, dsn: str) -> None:
    sup = start_supervisor()
    sup.notify.wait_for("READY")
    family = children(sup.pid)
    job_id = enqueue(dsn, "test.sleep", {"seconds": 30, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["status"] == "running")
    sup.signal(signal.SIGKILL)
    sup.wait(10)
    # PR_SET_PDEATHSIG sends each worker SIGTERM: a graceful stop that releases the job
    wait_until(lambda: not [pid for pid in family if alive(pid)], timeout=20)
    row = job(dsn, job_id)
    assert (row["status"], row["interrupt_count"]) == ("pending", 1)


def test_sigquit_stops_fast_and_reclaims_what_is_still_running(start_supervisor: Any, dsn: str) -> None:
    sup = start_supervisor(cancellation_grace_period=30, cleanup_grace_period=30, lock_timeout=30,
                           heartbeat_interval=1, sweep_interval=30)
    sup.notify.wait_for("READY")
    job_id = enqueue(dsn, "test.sleep", {"seconds": 60, "cooperative": False})
    wait_until(lambda: job(dsn, job_id)["status"] == "running")
    started = time.monotonic()
    sup.signal(signal.SIGQUIT)
    sup.notify.wait_for("STOPPING")
    assert sup.wait(15) == exitcodes.ERROR  # a worker had to be killed
    assert time.monotonic() - started < 10  # a graceful stop would take the 60 s of grace windows
    assert job(dsn, job_id)["status"] == "scheduled"
    assert reclaim_causes(dsn, job_id) == ["worker_died"]


# -- rolling restart and scaling -------------------------------------------------------------------


def test_sighup_rolls_every_worker_without_dropping_capacity_or_jobs(start_supervisor: Any, dsn: str) -> None:
    sup = start_supervisor()
    sup.notify.wait_for("READY")
    old = set(sup.wait_registered(2))
    query(dsn, "INSERT INTO taskq.jobs (actor, payload) "
               "SELECT 'test.sleep', jsonb_build_object('seconds', 0.05) FROM generate_series(1, 300)")
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    hup_at = time.monotonic()
    sup.signal(signal.SIGHUP)
    reloading = sup.notify.wait_for("RELOADING")
    assert int(reloading["MONOTONIC_USEC"]) > 0
    counts = []
    while True:
        pids = set(sup.registered())
        counts.append(len(pids))
        if len(pids) == 2 and not pids & old:
            break
        assert time.monotonic() - hup_at < 30, f"rolling restart did not finish: {sup.log()}"
        time.sleep(0.01)
    assert min(counts) >= 2, counts
    sup.notify.wait_for("READY", after=hup_at)
    wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status = 'succeeded'")[0][0] == 300,
               timeout=40)
    assert query(dsn, "SELECT count(*) FROM taskq.job_attempts WHERE outcome = 'succeeded'")[0][0] == 300
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == exitcodes.OK


def test_sigttin_adds_a_worker_and_sigttou_removes_one(start_supervisor: Any) -> None:
    sup = start_supervisor()
    sup.notify.wait_for("READY")
    first = sup.wait_registered(2)
    sup.signal(signal.SIGTTIN)
    assert set(first) < set(sup.wait_registered(3))
    sup.signal(signal.SIGTTOU)
    sup.wait_registered(2)
    wait_until(lambda: len(sup.workers()) == 2)
    sup.signal(signal.SIGTERM)
    assert sup.wait(20) == exitcodes.OK


# -- metrics, health, proctitles -------------------------------------------------------------------


def test_metrics_aggregate_every_worker_and_health_endpoints_answer(
    start_supervisor: Any, dsn: str, tmp_path: Path
) -> None:
    sup = start_supervisor(concurrency=1)
    sup.notify.wait_for("READY")
    # each job holds its worker's one slot until both run (a 0.5 s job could end, and its worker take the
    # second, before a loaded machine let the other worker claim it)
    gate = tmp_path / "gate"
    ids = [enqueue(dsn, "test.gated", {"path": str(gate)}) for _ in range(2)]
    wait_until(lambda: all(job(dsn, i)["status"] == "running" for i in ids))
    gate.write_text("open")
    wait_until(lambda: all(job(dsn, i)["status"] == "succeeded" for i in ids))
    # one slot each: the two jobs ran on the two workers
    assert len({r[0] for r in query(dsn, "SELECT worker_id FROM taskq.job_attempts")}) == 2
    status, text = http_get(sup.metrics_url())
    assert status == 200
    families = {f.name: f for f in text_string_to_metric_families(text)}
    claimed = [s for s in families["taskq_jobs_claimed"].samples if s.name == "taskq_jobs_claimed_total"]
    assert [(s.labels, s.value) for s in claimed] == [({"queue": "default"}, 2.0)]
    completed = {s.labels["status"]: s.value for s in families["taskq_jobs_completed"].samples
                 if s.name == "taskq_jobs_completed_total" and s.value}  # other statuses start at 0
    assert completed == {"succeeded": 2.0}
    assert http_get(sup.metrics_url("/healthz"))[0] == 200
    assert http_get(sup.metrics_url("/readyz")) == (200, "ok\n")
    assert http_get(sup.metrics_url("/nope"))[0] == 404


def test_proctitles_show_counts_and_never_the_password(start_supervisor: Any, dsn: str) -> None:
    secret = "sekrit-" + uuid.uuid4().hex[:8]
    sup = start_supervisor(dsn=f"{dsn} password={secret}")  # trust auth ignores it; argv carries it
    sup.notify.wait_for("READY")
    workers = sup.workers()
    assert len(workers) == 2
    titles = {pid: cmdline(pid) for pid in [sup.pid, *children(sup.pid)]}
    assert not [t for t in titles.values() if secret in t], titles
    assert re.fullmatch(r"taskq supervisor \[2 workers, 0 in flight\] " + re.escape(APP), titles[sup.pid])
    for pid in workers:
        assert re.fullmatch(r"taskq worker \d+ \[q=default, 0 running\]", titles[pid]), titles[pid]
    assert any(t.startswith("taskq metrics [127.0.0.1:") for t in titles.values()), titles
    assert secret not in sup.log()
