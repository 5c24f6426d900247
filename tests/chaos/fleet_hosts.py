"""A fleet of hosts on one machine: each host a network namespace (veth into a bridge) running one
`taskq` supervisor with its workers, all on one PostgreSQL that listens on the bridge's address.

Used by the CI-sized host-kill test (tests/chaos/test_fleet.py) and by benchmarks/fleet.py. Network
namespaces need root and iproute2 (`ip netns`); without them (`Fleet(netns=False)`, or not root) the hosts
are plain process groups on loopback: the same supervisors and the same whole-host kill, only without the
separate addresses.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import psycopg
from chaos_fleet import DedicatedPostgres

from taskq.backend import WORKER_APPLICATION_NAME

PORT = 5432


def netns_available() -> bool:
    """Root with iproute2: the hosts can be network namespaces."""
    return os.geteuid() == 0 and shutil.which("ip") is not None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def _free_subnet() -> str:
    """A 10.x.y.0/24 not configured on any interface here (other runs may hold bridges of their own)."""
    used = subprocess.run(["ip", "-4", "-o", "addr"], check=True, capture_output=True, text=True).stdout
    for _ in range(200):
        prefix = f"10.{random.randint(64, 250)}.{random.randint(1, 250)}"
        if f" {prefix}." not in used:
            return prefix
    raise RuntimeError("no free 10.x.y.0/24 subnet found")


class ListeningPostgres(DedicatedPostgres):
    """The run's own server (as the chaos run's), made to listen on TCP at `address` for `subnet` too."""

    def listen(self, address: str, subnet: str) -> str:
        """Restart listening on `address`; returns the admin DSN over TCP (database `postgres`)."""
        hba = self.pgdata / "pg_hba.conf"
        with open(hba, "a") as out:
            out.write(f"\nhost all all {subnet} trust\n")
        self._pg_ctl("stop", "-m", "fast")
        self._pg_ctl("-l", str(self.pgdata / "log"), "-o",
                     f'-h {address} -p {PORT} -k {self.socket_dir} -c max_connections=300', "start")
        self.port = PORT
        return f"postgresql://postgres@{address}:{PORT}/postgres"


class Host:
    """One supervisor (`python -m taskq.supervisor APP`) with its workers, in its own session, and in network
    namespace `netns` if given."""

    def __init__(self, name: str, netns: str | None, args: Sequence[str], env: dict[str, str], cwd: Path,
                 log_path: Path) -> None:
        self.name, self.netns, self.log_path = name, netns, log_path
        prefix = ["ip", "netns", "exec", netns] if netns else []
        full_env = {k: v for k, v in os.environ.items() if k not in ("NOTIFY_SOCKET", "WATCHDOG_USEC")}
        full_env |= env
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log_file:
            # `ip netns exec` execs the command: the pid is the supervisor's
            self.proc = subprocess.Popen([*prefix, sys.executable, "-m", "taskq.supervisor", *args], cwd=cwd,
                                         env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def pids(self) -> list[int]:
        """Every live process of this host: the supervisor leads a session of its own, and its workers (and
        their children) stay in it. (Not the environment: setproctitle overwrites /proc/<pid>/environ.)"""
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                # fields[0] is the state, fields[3] the session id (stat fields 3 and 6)
                if fields[0] != "Z" and int(fields[3]) == self.proc.pid:
                    found.append(int(entry.name))
        return found

    def kill(self) -> list[int]:
        """kill -9 of the whole host at once: the supervisor first stopped (SIGSTOP) so it restarts nothing,
        then SIGKILL to every process of the host. Returns the pids killed."""
        pids = self.pids()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        pids = sorted({*pids, *self.pids()})  # a child forked before its parent stopped
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)
        deadline = time.monotonic() + 10.0  # a SIGKILL is delivered asynchronously
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.01)
        return pids

    def stop(self, timeout: float = 60.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class Fleet:
    """The network (a bridge and one namespace per host) and the server. Use as a context manager: on exit
    every host is killed, the namespaces, the bridge and the server's data directory are removed."""

    def __init__(self, root: Path, hosts: int, *, netns: bool = True) -> None:
        self.root = root
        self.size = hosts
        self.netns = netns and netns_available()
        tag = uuid.uuid4().hex[:6]
        self.bridge = f"tqb{tag}"
        self.namespaces = [f"tq{tag}h{i}" for i in range(hosts)] if self.netns else []
        self._veths = [f"tqv{tag}{i}" for i in range(hosts)]
        self.pg = ListeningPostgres(root / "server")
        self.hosts: list[Host] = []
        self.admin_dsn = ""
        self.server_address = "127.0.0.1"

    def __enter__(self) -> Fleet:
        try:
            self.admin_dsn = self.pg.start()
            if self.netns:
                self._network()
                self.admin_dsn = self.pg.listen(self.server_address, self._subnet)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _network(self) -> None:
        prefix = _free_subnet()
        self._subnet = f"{prefix}.0/24"
        self.server_address = f"{prefix}.1"
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.server_address}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i, (ns, veth) in enumerate(zip(self.namespaces, self._veths, strict=True)):
            peer = veth.replace("tqv", "tqp", 1)
            _ip("netns", "add", ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("-n", ns, "addr", "add", f"{prefix}.{10 + i}/24", "dev", peer)
            _ip("-n", ns, "link", "set", peer, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    def dsn(self, dbname: str) -> str:
        """A DSN of database `dbname` that every host can reach (TCP to the bridge address, or the socket)."""
        base, _, _query = self.admin_dsn.partition("?")
        head = base.rsplit("/", 1)[0]
        return f"{head}/{dbname}" + (f"?{_query}" if _query else "")

    def start_host(self, i: int, args: Sequence[str], env: dict[str, str], cwd: Path) -> Host:
        host = Host(f"host{i}", self.namespaces[i] if self.netns else None, args, env, cwd,
                    self.root / f"host{i}.log")
        self.hosts.append(host)
        return host

    def stop_hosts(self, timeout: float = 60.0) -> list[int | None]:
        codes = [h.stop(timeout) for h in self.hosts]
        self.hosts.clear()
        return codes

    def __exit__(self, *exc: object) -> None:
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.kill()
        self.hosts.clear()
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        if self.netns:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
        self.pg.close()



def wait_connections_gone(dsn: str, worker_ids: Sequence[str], timeout: float = 60.0) -> None:
    """Until PostgreSQL has ended every session of these (killed) workers. A commit they sent before they
    died can still land until their backends notice the dead socket: only then is what they held final."""
    names = [WORKER_APPLICATION_NAME + w for w in worker_ids]
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while (conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)",
                            (names,)).fetchone() or (0,))[0]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"sessions of the killed workers {list(worker_ids)} still open after {timeout}s")
            time.sleep(0.02)
