"""The supervisor's /readyz (its metrics helper's HTTP server, in process here, against a real database):
many requests share one database connection and a cached verdict, the handlers are bounded in number and
in time, and an unreachable database answers a fixed text that names no server."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import psycopg
from testkit import wait_until

from taskq.supervisor.metrics_http import BoundedHTTPServer, HealthBoard, metrics_server


@contextmanager
def serving(dsn: str, tmp_path: Path, **options: float) -> Iterator[tuple[BoundedHTTPServer, int]]:
    sock = socket.create_server(("127.0.0.1", 0))
    server = metrics_server(sock, metrics_dir=str(tmp_path), dsn=dsn, board=HealthBoard(), **options)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server, int(sock.getsockname()[1])
    finally:
        server.shutdown()
        server.server_close()
        server.readiness.close()
        thread.join(10)


def get(port: int, path: str) -> tuple[int, str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def sessions(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    conn.execute("SELECT pg_stat_clear_snapshot()")
    (n,) = conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone() or (0,)
    return int(str(n))


def others(conn: psycopg.Connection[tuple[object, ...]]) -> int:
    (n,) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND pid <> pg_backend_pid()").fetchone() or (0,)
    return int(str(n))


def test_many_readyz_requests_open_at_most_one_session(dsn: str, tmp_path: Path) -> None:
    with psycopg.connect(dsn, autocommit=True) as watcher:
        watcher.execute("SELECT pg_stat_force_next_flush()")  # our own session counted before we start
        wait_until(lambda: others(watcher) == 0, timeout=30)
        before = sessions(watcher)
        with serving(dsn, tmp_path) as (_, port), ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda _: get(port, "/readyz"), range(60)))
        assert set(answers) == {(200, "ok\n")}
        # every session of this database but ours has ended, and a session's statistics are written as it ends
        wait_until(lambda: others(watcher) == 0, timeout=30)
        assert sessions(watcher) - before <= 2


def test_past_the_handler_bound_readyz_answers_503_at_once_and_silent_clients_time_out(
        dsn: str, tmp_path: Path) -> None:
    with serving(dsn, tmp_path, max_handlers=2, handler_timeout=60) as (_, port):
        # the two silent clients are the server's first connections, accepted before any other: a request
        # answered just before them could still hold its handler's slot (its thread ends after the answer),
        # leaving one silent client without a slot and every later request a free one
        silent = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        try:
            busy = wait_until(lambda: (r := get(port, "/readyz"))[0] == 503 and r, timeout=15)
            assert busy == (503, "busy\n")
        finally:
            for s in silent:
                s.close()
        wait_until(lambda: get(port, "/readyz") == (200, "ok\n"), timeout=15)  # served again once they left
    with serving(dsn, tmp_path, handler_timeout=0.5) as (_, port):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            assert s.recv(1) == b""  # the handler gave up on a client that sent nothing


def test_an_unreachable_database_answers_a_fixed_text(tmp_path: Path) -> None:
    dsn = "postgresql://taskq_worker:TopS3cret@127.0.0.1:1/app?sslpassword=KeyPassphrase&connect_timeout=2"
    with serving(dsn, tmp_path) as (_, port):
        assert get(port, "/readyz") == (503, "database unreachable\n")
        assert get(port, "/readyz") == (503, "database unreachable\n")
