"""A real 3-node Patroni cluster on loopback, and the faults the failover drill injects into it.

    cluster = Cluster(Path(tempfile.mkdtemp()), synchronous=True)
    cluster.start()                 # 3 etcd members, 3 Patroni nodes, PostgreSQL 15 on 5441-5443
    cluster.leader()                # from Patroni's REST API (GET /cluster)
    cluster.kill_node("n1"); cluster.start_node("n1")
    cluster.close()

Each node is one etcd member + one Patroni + the PostgreSQL it manages, all in a cgroup of the node's own,
and its Patroni talks only to its own etcd member. `partition_node` cuts a node off for real: iptables (in
chains of the run's own) drops every TCP packet the node's processes send on loopback (matched by their
cgroup, so kernel ACKs of their sockets too) and every packet sent to the node's ports. Its clients see
half-open sockets, its etcd member loses the quorum, its Patroni loses the DCS. Ports alone cannot do this on
one loopback address: connections that a node's processes open leave from ephemeral ports, and Patroni's etcd
client moves to the other members' client URLs. Patroni reaches its own PostgreSQL over the unix socket, which
the partition leaves alone, as a local socket would be on a real host.

Patroni runs as the `postgres` OS user from the venv `tools/ha/setup.sh` builds (TASKQ_HA_PREFIX, default
/opt/taskq-ha); the PostgreSQL binaries are Debian's 15 (TASKQ_HA_PG_BIN). Requires root (to start processes
as postgres, and for iptables).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

PREFIX = Path(os.environ.get("TASKQ_HA_PREFIX", "/opt/taskq-ha"))
PG_BIN = Path(os.environ.get("TASKQ_HA_PG_BIN", "/usr/lib/postgresql/15/bin"))
OS_USER = "postgres"
NODES = ("n1", "n2", "n3")
TTL, LOOP_WAIT, RETRY_TIMEOUT = 20, 2, 4
"""Patroni's timing. Patroni 4.1.5 raises a ttl under 20 to 20, and needs loop_wait + 2 * retry_timeout <= ttl."""
assert LOOP_WAIT + 2 * RETRY_TIMEOUT <= TTL
CHAINS = {"OUTPUT": "TASKQ_HA_OUT", "INPUT": "TASKQ_HA_IN"}
"""The iptables chains of partitions (jumped to from OUTPUT and INPUT; removed when the cluster closes)."""


def cgroup2_root() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (alone, or beside v1 controllers as `unified`)."""
    for line in Path("/proc/mounts").read_text().splitlines():
        fields = line.split()
        if len(fields) > 2 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def missing_tools() -> list[str]:
    """What this machine lacks to run a cluster (empty when it can): say which, so a skip names it."""
    missing = []
    if shutil.which("etcd") is None:
        missing.append("etcd (apt-get install etcd-server; tools/ha/setup.sh)")
    if not (PREFIX / "bin" / "patroni").exists():
        missing.append(f"Patroni in {PREFIX} (tools/ha/setup.sh)")
    if not (PG_BIN / "postgres").exists():
        missing.append(f"PostgreSQL binaries in {PG_BIN}")
    if shutil.which("iptables") is None:
        missing.append("iptables (apt-get install iptables; tools/ha/setup.sh)")
    if cgroup2_root() is None:
        missing.append("a cgroup v2 hierarchy (partitions match a node's processes by cgroup)")
    if os.geteuid() != 0:
        missing.append("root (Patroni runs as postgres, partitions use iptables)")
    return missing


@dataclass(frozen=True)
class Ports:
    pg: int
    rest: int
    etcd_client: int
    etcd_peer: int


def node_ports(index: int, base: int = 0) -> Ports:
    """Node n1..n3: PostgreSQL 5441-5443, REST 8441-8443, etcd client 2451-2453 and peer 2461-2463."""
    return Ports(5440 + index + base, 8440 + index + base, 2450 + index + base, 2460 + index + base)


@dataclass
class Node:
    name: str
    index: int
    ports: Ports
    root: Path
    patroni: subprocess.Popen[bytes] | None = None
    etcd: subprocess.Popen[bytes] | None = None
    cgroup: Path | None = None
    stopped: set[int] = field(default_factory=set)
    """Pids this run SIGSTOPped and has not yet continued."""

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.ports.rest}"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.ports.pg} dbname={dbname} user=postgres connect_timeout=2"

    def postmaster_pid(self) -> int | None:
        try:
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def postgres_pids(self) -> list[int]:
        """The postmaster and its children (backends, walreceiver, background workers)."""
        master = self.postmaster_pid()
        if master is None:
            return []
        return [master, *_children(master)]

    def join_cgroup(self, pid: int) -> None:
        """Put a process of the node (etcd, Patroni; PostgreSQL inherits it from Patroni) in its cgroup."""
        if self.cgroup is not None:
            (self.cgroup / "cgroup.procs").write_text(str(pid))


class Cluster:
    """Three etcd members and three Patroni nodes in `root` (a fresh directory), synchronous_mode_strict or
    asynchronous. `close()` leaves no process, chain or file behind, after a failure too."""

    def __init__(self, root: Path, *, synchronous: bool, max_lag_on_failover: int = 1 << 20,
                 port_base: int = 0, log: Any = None) -> None:
        self.root = root
        self.synchronous = synchronous
        self.max_lag_on_failover = max_lag_on_failover
        self.nodes = {name: Node(name, i + 1, node_ports(i + 1, port_base), root / name)
                      for i, name in enumerate(NODES)}
        self.log = log or (lambda message: None)
        self._chain_made = False
        self.partitioned: set[str] = set()
        self.cgroups: Path | None = None

    # -- the multi-host DSN -------------------------------------------------------------------------

    def multi_host_dsn(self, dbname: str) -> str:
        ports = ",".join(str(n.ports.pg) for n in self.nodes.values())
        return (f"host=127.0.0.1,127.0.0.1,127.0.0.1 port={ports} dbname={dbname} user=postgres "
                f"target_session_attrs=read-write connect_timeout=3")

    # -- start and stop ------------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> None:
        missing = missing_tools()
        if missing:
            raise RuntimeError("cannot run a Patroni cluster here; missing: " + "; ".join(missing))
        for node in self.nodes.values():
            for port in (node.ports.pg, node.ports.rest, node.ports.etcd_client, node.ports.etcd_peer):
                if _port_taken(port):
                    raise RuntimeError(f"port {port} on 127.0.0.1 is taken (another cluster or server?)")
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o755)
        token = f"taskq-ha-{os.getpid()}-{int(time.time())}"
        cg_root = cgroup2_root()
        assert cg_root is not None
        self.cgroups = cg_root / token
        self.cgroups.mkdir()
        initial = ",".join(f"e{n.index}=http://127.0.0.1:{n.ports.etcd_peer}" for n in self.nodes.values())
        for node in self.nodes.values():
            node.root.mkdir(parents=True, exist_ok=True)
            shutil.chown(node.root, OS_USER, OS_USER)
            os.chmod(node.root, 0o700)
            node.cgroup = self.cgroups / node.name
            node.cgroup.mkdir()
            etcd_dir = self.root / f"etcd-{node.name}"
            etcd_dir.mkdir(exist_ok=True)
            client, peer = f"http://127.0.0.1:{node.ports.etcd_client}", f"http://127.0.0.1:{node.ports.etcd_peer}"
            args = ["etcd", "--name", f"e{node.index}", "--data-dir", str(etcd_dir / "data"),
                    "--listen-client-urls", client, "--advertise-client-urls", client,
                    "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", token, "--log-level", "warn"]
            with open(etcd_dir / "etcd.log", "ab") as out:
                node.etcd = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=str(etcd_dir))
            node.join_cgroup(node.etcd.pid)
            (node.root / "patroni.yml").write_text(json.dumps(self._patroni_config(node), indent=1))
            shutil.chown(node.root / "patroni.yml", OS_USER, OS_USER)
        self._wait(lambda: all(_etcd_healthy(n) for n in self.nodes.values()), 30, "etcd members healthy")
        for node in self.nodes.values():
            self.start_patroni(node.name)
            if node.index == 1:  # the first one bootstraps; the others then clone from it
                self._wait(lambda: self.leader() is not None, timeout, "a leader bootstrapped")
        self.wait_healthy(timeout)
        self._ensure_chains()

    def _patroni_config(self, node: Node) -> dict[str, Any]:
        parameters = {
            "wal_level": "replica", "hot_standby": "on", "max_wal_senders": 10, "max_replication_slots": 10,
            "wal_log_hints": "on", "max_connections": 200, "shared_buffers": "64MB", "wal_keep_size": "256MB",
            "synchronous_commit": "on", "log_min_messages": "warning",
        }
        dcs: dict[str, Any] = {
            "ttl": TTL, "loop_wait": LOOP_WAIT, "retry_timeout": RETRY_TIMEOUT,
            "maximum_lag_on_failover": self.max_lag_on_failover,
            "postgresql": {"use_pg_rewind": True, "use_slots": True, "parameters": parameters},
        }
        if self.synchronous:
            dcs |= {"synchronous_mode": True, "synchronous_mode_strict": True}
        return {
            "scope": "taskq-ha",
            "name": node.name,
            "log": {"dir": str(node.root), "level": "INFO", "file_num": 2},
            "restapi": {"listen": f"127.0.0.1:{node.ports.rest}", "connect_address": f"127.0.0.1:{node.ports.rest}"},
            # its own member only: a partition of the node's ports then cuts its Patroni off the DCS
            "etcd3": {"hosts": [f"127.0.0.1:{node.ports.etcd_client}"]},
            "bootstrap": {"dcs": dcs, "initdb": [{"encoding": "UTF8"}, {"locale": "C"}]},
            "postgresql": {
                "listen": f"127.0.0.1:{node.ports.pg}",
                "connect_address": f"127.0.0.1:{node.ports.pg}",
                "use_unix_socket": True,
                "data_dir": str(node.data_dir),
                "bin_dir": str(PG_BIN),
                "pgpass": str(node.root / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(node.root)},
                "pg_hba": ["local all all trust", "host all all 127.0.0.1/32 trust",
                           "host replication all 127.0.0.1/32 trust"],
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False, "nosync": False},
        }

    def start_patroni(self, name: str) -> None:
        node = self.nodes[name]
        env = {"PATH": f"{PREFIX / 'bin'}:/usr/bin:/bin", "HOME": str(node.root), "LANG": "C.UTF-8"}
        with open(node.root / "patroni.out", "ab") as out:
            node.patroni = subprocess.Popen([str(PREFIX / "bin" / "patroni"), str(node.root / "patroni.yml")],
                                            user=OS_USER, group=OS_USER, env=env, cwd=str(node.root),
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        # before it starts PostgreSQL (a second or more away), which then inherits the cgroup
        node.join_cgroup(node.patroni.pid)

    def start_node(self, name: str) -> None:
        """Start a node's Patroni again after `kill_node` (it rejoins, with pg_rewind if it must)."""
        node = self.nodes[name]
        if node.patroni is not None and node.patroni.poll() is None:
            return
        self.start_patroni(name)

    def wait_healthy(self, timeout: float = 90.0) -> None:
        """A leader, two streaming replicas, and in synchronous mode a synchronous standby."""
        self._wait(self.healthy, timeout, "the cluster healthy (leader, 2 streaming replicas)")

    def healthy(self) -> bool:
        members = self.members()
        if members is None:
            return False
        roles = [m.get("role") for m in members]
        streaming = [m for m in members if m.get("role") != "leader" and m.get("state") == "streaming"]
        sync_ok = not self.synchronous or "sync_standby" in roles
        return roles.count("leader") == 1 and len(streaming) == 2 and sync_ok

    def close(self) -> None:
        """Stop everything of the run: continue what was stopped, heal partitions, stop Patroni (it stops
        PostgreSQL), then kill what remains; remove the directory."""
        self.heal()
        self._drop_chains()
        for node in self.nodes.values():
            for pid in list(node.stopped):
                _signal(pid, signal.SIGCONT)
            node.stopped.clear()
        for node in self.nodes.values():
            if node.patroni is not None and node.patroni.poll() is None:
                node.patroni.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for node in self.nodes.values():
            if node.patroni is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.patroni.wait(max(0.1, deadline - time.monotonic()))
                if node.patroni.poll() is None:
                    node.patroni.kill()
                    node.patroni.wait(10)
            for pid in node.postgres_pids():
                _signal(pid, signal.SIGKILL)
        for node in self.nodes.values():
            if node.etcd is not None and node.etcd.poll() is None:
                node.etcd.kill()
                node.etcd.wait(10)
        if self.cgroups is not None:
            for node in self.nodes.values():
                if node.cgroup is not None:
                    for member in (node.cgroup / "cgroup.procs").read_text().split():
                        _signal(int(member), signal.SIGKILL)
                    _wait_gone(node.cgroup)
                    with contextlib.suppress(OSError):
                        node.cgroup.rmdir()
            with contextlib.suppress(OSError):
                self.cgroups.rmdir()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- what the cluster says -------------------------------------------------------------------------

    def members(self) -> list[dict[str, Any]] | None:
        """`GET /cluster` from the first node that answers (a partitioned or frozen one does not)."""
        for node in self.nodes.values():
            if node.name in self.partitioned:
                continue
            try:
                with urllib.request.urlopen(node.api + "/cluster", timeout=1.0) as response:
                    members: list[dict[str, Any]] = json.load(response)["members"]
                    return members
            except (OSError, ValueError, KeyError):
                continue
        return None

    def leader(self) -> str | None:
        members = self.members() or []
        leaders = [m["name"] for m in members if m.get("role") == "leader" and m.get("state") == "running"]
        return leaders[0] if len(leaders) == 1 else None

    def replicas(self) -> list[str]:
        return [m["name"] for m in self.members() or [] if m.get("role") in ("replica", "sync_standby")]

    def sync_standby(self) -> str | None:
        found = [m["name"] for m in self.members() or [] if m.get("role") == "sync_standby"]
        return found[0] if found else None

    # -- faults ------------------------------------------------------------------------------------------

    def kill_node(self, name: str) -> str:
        """SIGKILL the node's Patroni and every PostgreSQL process of it at once (a crashed host)."""
        node = self.nodes[name]
        pids = node.postgres_pids()
        if node.patroni is not None and node.patroni.poll() is None:
            pids.insert(0, node.patroni.pid)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        if node.patroni is not None:
            node.patroni.wait(10)
        for pid in pids:
            node.stopped.discard(pid)
        return f"{name}: SIGKILL {len(pids)} processes"

    def switchover(self, candidate: str | None = None) -> str:
        """A planned switchover through the REST API (POST /switchover), to `candidate` or Patroni's pick."""
        leader = self.leader()
        if leader is None:
            raise RuntimeError("no leader to switch over from")
        if candidate is None:
            candidate = self.sync_standby() if self.synchronous else None
        body: dict[str, Any] = {"leader": leader}
        if candidate is not None:
            body["candidate"] = candidate
        request = urllib.request.Request(self.nodes[leader].api + "/switchover", data=json.dumps(body).encode(),
                                         method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                said = response.read().decode(errors="replace").strip()
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"switchover refused ({exc.code}): {exc.read().decode(errors='replace')}") from exc
        return f"{leader} -> {candidate or 'any'}: {said}"

    def stop_processes(self, pids: list[int], node: str) -> None:
        for pid in pids:
            if _signal(pid, signal.SIGSTOP):
                self.nodes[node].stopped.add(pid)

    def continue_processes(self, node: str) -> int:
        stopped = self.nodes[node].stopped
        count = sum(_signal(pid, signal.SIGCONT) for pid in stopped)
        stopped.clear()
        return count

    def patroni_pid(self, name: str) -> int | None:
        process = self.nodes[name].patroni
        return process.pid if process is not None and process.poll() is None else None

    def partition_node(self, name: str) -> None:
        """Cut the node off: nothing its processes send on loopback leaves, nothing sent to its ports
        arrives (see the module doc)."""
        node = self.nodes[name]
        assert self.cgroups is not None and node.cgroup is not None
        self._ensure_chains()
        path = str(node.cgroup.relative_to(self.cgroups.parent))
        _iptables("-A", CHAINS["OUTPUT"], "-o", "lo", "-m", "cgroup", "--path", path, "-j", "DROP")
        for port in (node.ports.pg, node.ports.rest, node.ports.etcd_client, node.ports.etcd_peer):
            _iptables("-A", CHAINS["INPUT"], "-i", "lo", "-p", "tcp", "--dport", str(port), "-j", "DROP")
        self.partitioned.add(name)

    def hold_back_replication(self, leader: str) -> list[str]:
        """Lag for real: drop the WAL the leader sends to each streaming replica (its walsender's packets to
        the walreceiver's port, from pg_stat_replication), so that the leader's commits stay on it alone.
        Stopping the walreceivers would not do: the kernel still takes the WAL into their sockets' buffers.
        Returns the replicas held back; `heal()` lets the stream go again."""
        node = self.nodes[leader]
        with psycopg.connect(node.dsn(), autocommit=True) as conn:
            rows = conn.execute("SELECT application_name, client_port FROM pg_stat_replication "
                                "WHERE client_port IS NOT NULL").fetchall()
        self._ensure_chains()
        for _, port in rows:
            _iptables("-A", CHAINS["INPUT"], "-i", "lo", "-p", "tcp", "--sport", str(node.ports.pg),
                      "--dport", str(port), "-j", "DROP")
        return sorted(str(name) for name, _ in rows)

    def etcd_alive(self) -> list[str]:
        """The etcd members whose process died (none should: the drill never kills one)."""
        return [n.name for n in self.nodes.values() if n.etcd is not None and n.etcd.poll() is not None]

    def heal(self) -> None:
        if self._chain_made:
            for chain in CHAINS.values():
                _iptables("-F", chain, check=False)
        self.partitioned.clear()

    def _ensure_chains(self) -> None:
        if self._chain_made:
            return
        for builtin, chain in CHAINS.items():
            # a chain an earlier, killed run left behind: flush and reuse it
            if _iptables("-N", chain, check=False) != 0:
                _iptables("-F", chain)
            if _iptables("-C", builtin, "-j", chain, check=False) != 0:
                _iptables("-I", builtin, "-j", chain)
        self._chain_made = True

    def _drop_chains(self) -> None:
        if not self._chain_made:
            return
        for builtin, chain in CHAINS.items():
            _iptables("-D", builtin, "-j", chain, check=False)
            _iptables("-F", chain, check=False)
            _iptables("-X", chain, check=False)
        self._chain_made = False

    # -- helpers -------------------------------------------------------------------------------------------

    def _wait(self, predicate: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if predicate():
                    return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout:g}s waiting for {what}; members: {self.members()}\n"
                           + self.tail_logs())

    def tail_logs(self, lines: int = 15) -> str:
        said = []
        for node in self.nodes.values():
            for log in (node.root / "patroni.out", node.root / "patroni.log"):
                with contextlib.suppress(OSError):
                    said.append(f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(said)


def _iptables(*args: str, check: bool = True) -> int:
    done = subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True)
    if check and done.returncode:
        raise RuntimeError(f"iptables {' '.join(args)} failed: {done.stderr.strip()}")
    return done.returncode


def _etcd_healthy(node: Node) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.ports.etcd_client}/health", timeout=1.0) as response:
            return bool(json.load(response).get("health") == "true")
    except (OSError, ValueError):
        return False


def _wait_gone(cgroup: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if not (cgroup / "cgroup.procs").read_text().split():
                return
        time.sleep(0.05)


def _port_taken(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.3)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent:
                found.append(int(entry.name))
    return found


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True
