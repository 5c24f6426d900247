"""Prometheus multiprocess mode and the HTTP endpoint (`/metrics`, `/healthz`, `/readyz`).

How the supervisor enters multiprocess mode: prometheus_client picks its value class (in-memory, or
mmap-backed files in PROMETHEUS_MULTIPROC_DIR) when `prometheus_client.values` is first imported, and
every metric object keeps the class it was created with. Importing taskq imports no prometheus_client,
and taskq.metrics creates its collectors at their first use, so the supervisor creates a fresh directory
and puts it in its environment before anything has imported prometheus_client (`enter_multiprocess_mode`).
From then on every metric in the supervisor, and so in every forked worker, writes to per-pid files
there; after a fork prometheus_client notices the new pid on the first update and opens the child's own
files. Only something that imported prometheus_client before the supervisor started (a sitecustomize,
say) can defeat this, and then the supervisor refuses to start rather than serve one process's numbers.

Why a forked helper process serves HTTP: the supervisor forks replacement workers for as long as it
runs, and fork() from a process with other threads copies locks held by those threads (logging,
allocator, psycopg) into the child in a locked state. So the supervisor stays single-threaded and
forks, once and before any thread exists, a small helper that may use threads freely because it never
forks. The helper also keeps slow scrapes and a slow `/readyz` database check out of the supervisor's
loop. The supervisor binds the listening socket itself (so a bad port fails at start and port 0 is
known and logged) and feeds the helper its health verdict over a pipe.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("taskq.supervisor.metrics")

ENV_DIR = "PROMETHEUS_MULTIPROC_DIR"
ENV_OWNED = "TASKQ_SUPERVISOR_METRICS_DIR"
"""Set beside PROMETHEUS_MULTIPROC_DIR when the supervisor created that directory (it removes it at exit)."""
TEXT = "text/plain; charset=utf-8"
HEALTH_STALE_AFTER = 10.0
"""Seconds without a health update from the supervisor before /healthz says the supervisor is stuck."""
READY_CACHE_SECONDS = 1.0
"""/readyz asks the database at most this often; the requests in between get the last verdict."""
MAX_HANDLERS = 8
"""Requests served at once; one more is answered 503 at once, without a thread."""
HANDLER_TIMEOUT = 10.0
"""Seconds a connection may stay silent (a slow client) before its handler gives up on it."""
UNREACHABLE = "database unreachable\n"


# -- the multiprocess directory ---------------------------------------------------------------------


def enter_multiprocess_mode() -> bool:
    """Point PROMETHEUS_MULTIPROC_DIR at a fresh directory of this run, for this process and every child.
    False (and nothing created) when prometheus_client was already imported in single-process mode: its
    metrics could then never be summed across the workers."""
    values = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        return False
    path = fresh_metrics_dir()
    os.environ[ENV_DIR] = path
    os.environ[ENV_OWNED] = path
    return True


DIR_PREFIX = "taskq-metrics-"


def fresh_metrics_dir() -> str:
    """A new private directory for this run (systemd's RuntimeDirectory when there is one, else the
    temp dir). Reusing an old one would resurrect dead processes' counters. The name carries our pid,
    so directories left by supervisors that were killed outright are recognised and removed here."""
    base = os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0] or tempfile.gettempdir()
    _remove_orphaned_dirs(base)
    return tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=base)


def _remove_orphaned_dirs(base: str) -> None:
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        owner = name.removeprefix(DIR_PREFIX).split("-", 1)[0]
        if not name.startswith(DIR_PREFIX) or not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def remove_metrics_dir() -> None:
    path = os.environ.get(ENV_DIR)
    if path and os.environ.get(ENV_OWNED) == path:
        shutil.rmtree(path, ignore_errors=True)


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (in flight, leaked threads); its counters stay in the sums."""
    from prometheus_client import multiprocess

    try:
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
    except OSError as exc:
        log.warning("could not clean the metrics files of pid %d: %s", pid, exc)


def render_metrics(path: str) -> bytes:
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


# -- the helper process -----------------------------------------------------------------------------


class HealthBoard:
    """The latest health verdict the supervisor sent, and when it arrived (helper side)."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {"healthy": False, "reason": "starting"}
        self.updated = time.monotonic()
        self.lock = threading.Lock()

    def follow(self, fd: int) -> None:
        with os.fdopen(fd, "rb", buffering=0) as pipe:
            buffered = b""
            while True:
                chunk = pipe.read(65536)
                if not chunk:  # the supervisor is gone: so are we
                    os._exit(0)
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                if lines:
                    try:
                        state = json.loads(lines[-1])
                    except ValueError:
                        continue
                    with self.lock:
                        self.state = state
                        self.updated = time.monotonic()

    def verdict(self) -> tuple[bool, str]:
        with self.lock:
            age = time.monotonic() - self.updated
            state = dict(self.state)
        if age > HEALTH_STALE_AFTER:
            return False, f"supervisor unresponsive for {age:.1f}s"
        return bool(state.get("healthy")), str(state.get("reason", ""))


class Readiness:
    """The /readyz verdict: computed on one reused database connection (taskq.backend.supervisor.Pinger)
    at most once per READY_CACHE_SECONDS, whatever the number of requests. Thread-safe."""

    def __init__(self, dsn: str, cache_seconds: float = READY_CACHE_SECONDS) -> None:
        from taskq.backend.supervisor import Pinger

        self.pinger = Pinger(dsn)
        self.cache_seconds = cache_seconds
        self.lock = threading.Lock()
        self.checked_at: float | None = None
        self.ready = False

    def verdict(self) -> bool:
        with self.lock:
            now = time.monotonic()
            if self.checked_at is None or now - self.checked_at >= self.cache_seconds:
                try:
                    self.pinger.ping()
                    self.ready = True
                except Exception as exc:  # its message names the server, never the password: the log only
                    if self.ready or self.checked_at is None:
                        log.warning("readyz: %s", exc)
                    self.ready = False
                self.checked_at = time.monotonic()
            return self.ready

    def close(self) -> None:
        with self.lock:
            self.pinger.close()


def _handler(metrics_dir: str, readiness: Readiness, board: HealthBoard,
             handler_timeout: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "taskq"
        timeout = handler_timeout

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                from prometheus_client import CONTENT_TYPE_LATEST

                try:
                    body = render_metrics(metrics_dir)
                except Exception as exc:
                    self._reply(500, f"collecting metrics failed: {exc}\n")
                    return
                self._reply(200, body, CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                healthy, reason = board.verdict()
                self._reply(200 if healthy else 503, (reason or ("ok" if healthy else "unhealthy")) + "\n")
            elif path == "/readyz":
                if readiness.verdict():
                    self._reply(200, "ok\n")
                else:
                    self._reply(503, UNREACHABLE)
            else:
                self._reply(404, "not found: try /metrics, /healthz or /readyz\n")

        def _reply(self, code: int, body: bytes | str, content_type: str = TEXT) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s " + format, self.address_string(), *args)

    return Handler


_BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
         b"Content-Length: 5\r\nConnection: close\r\n\r\nbusy\n")


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per request, at most `max_handlers` at once; past that, 503 without a thread."""

    daemon_threads = True

    def __init__(self, sock: socket.socket, handler: type[BaseHTTPRequestHandler], max_handlers: int,
                 readiness: Readiness) -> None:
        super().__init__(sock.getsockname()[:2], handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.slots = threading.BoundedSemaphore(max_handlers)
        self.readiness = readiness

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def metrics_server(sock: socket.socket, *, metrics_dir: str, dsn: str, board: HealthBoard,
                   max_handlers: int = MAX_HANDLERS, handler_timeout: float = HANDLER_TIMEOUT) -> BoundedHTTPServer:
    """The helper's HTTP server on the bound, listening `sock` (serve_forever to run it)."""
    readiness = Readiness(dsn)
    return BoundedHTTPServer(sock, _handler(metrics_dir, readiness, board, handler_timeout), max_handlers,
                             readiness)


class MetricsHelper:
    """The parent's handle on the HTTP helper: bind, fork, publish health, restart, stop."""

    def __init__(self, host: str, port: int, *, dsn: str, metrics_dir: str) -> None:
        self.dsn = dsn
        self.metrics_dir = metrics_dir
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.create_server((host, port), family=family, backlog=64)
        self.sock.set_inheritable(False)
        bound = self.sock.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else f"{bound[0]}:{bound[1]}"
        self.pid: int | None = None
        self._health_w: int | None = None
        self.restart_at: float | None = None

    def parent_fds(self) -> list[int]:
        """Descriptors a forked worker must close."""
        fds = [self.sock.fileno()]
        if self._health_w is not None:
            fds.append(self._health_w)
        return fds

    def start(self, child_setup: Callable[[list[int]], None]) -> None:
        """Fork the helper. `child_setup(keep)` runs first in the child: the supervisor's fork hygiene."""
        health_r, health_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(health_w)
                if self._health_w is not None:
                    os.close(self._health_w)
                child_setup([self.sock.fileno(), health_r])
                self._serve(health_r)
            finally:
                os._exit(1)
        os.close(health_r)
        if self._health_w is not None:
            os.close(self._health_w)
        os.set_blocking(health_w, False)
        self._health_w = health_w
        self.pid = pid
        self.restart_at = None

    def _serve(self, health_r: int) -> None:
        from taskq.supervisor.proctitle import helper_title, set_title

        set_title(helper_title(self.address))
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor decides when we stop
        board = HealthBoard()
        threading.Thread(target=board.follow, args=(health_r,), name="taskq-health", daemon=True).start()
        server = metrics_server(self.sock, metrics_dir=self.metrics_dir, dsn=self.dsn, board=board)
        server.serve_forever(poll_interval=1.0)

    def publish(self, state: dict[str, Any]) -> None:
        if self._health_w is None:
            return
        try:
            os.write(self._health_w, json.dumps(state).encode() + b"\n")
        except BlockingIOError:
            pass  # the helper is behind; the next update says the same
        except OSError:
            pass  # the helper died; the reaper restarts it

    def on_exit(self, now: float) -> None:
        self.pid = None
        self.restart_at = now + 1.0

    def stop(self, timeout: float = 3.0) -> None:
        if self.pid is None:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.02)
        else:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        self.pid = None

    def close(self) -> None:
        self.sock.close()
        if self._health_w is not None:
            os.close(self._health_w)
            self._health_w = None
