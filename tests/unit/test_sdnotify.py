"""sd_notify without python-systemd: message format, and real datagrams over sockets this test binds."""

from __future__ import annotations

import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from taskq.supervisor.sdnotify import (
    Notifier,
    format_message,
    monotonic_usec,
    socket_address,
    watchdog_interval,
)

pytestmark = pytest.mark.timeout(10)


def test_message_is_key_value_lines_in_order() -> None:
    message = format_message({"READY": 1, "STATUS": "2 workers, 0 in flight"})
    assert message == b"READY=1\nSTATUS=2 workers, 0 in flight"


def test_booleans_are_sent_as_digits() -> None:
    assert format_message({"READY": True, "STOPPING": False}) == b"READY=1\nSTOPPING=0"


def test_a_newline_inside_a_value_cannot_start_another_assignment() -> None:
    assert format_message({"STATUS": "line one\nREADY=1"}) == b"STATUS=line one READY=1"


@pytest.mark.parametrize("key", ["", "ready", "STATUS=", "A B"])
def test_invalid_field_names_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        format_message({key: 1})


def test_an_at_sign_names_the_abstract_namespace() -> None:
    assert socket_address("@taskq/notify") == "\0taskq/notify"
    assert socket_address("/run/systemd/notify") == "/run/systemd/notify"


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_pid_only() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "3000000"}) == 1.5
    assert watchdog_interval({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": str(os.getpid())}) == 1.5
    assert watchdog_interval({"WATCHDOG_USEC": "3000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}) is None


def test_monotonic_usec_follows_clock_monotonic() -> None:
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert before <= monotonic_usec() <= before + 5_000_000


def test_without_notify_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    notifier = Notifier()
    assert not notifier.enabled
    assert notifier.ready() is False


def test_a_missing_socket_is_reported_as_not_sent_and_never_raises(tmp_path: Path) -> None:
    notifier = Notifier(str(tmp_path / "nobody-listens"))
    assert notifier.enabled
    assert notifier.stopping() is False
    notifier.close()


@pytest.fixture
def path_listener() -> Iterator[tuple[str, socket.socket]]:
    # AF_UNIX paths are limited to 108 bytes: a short private directory, not pytest's tmp_path
    with tempfile.TemporaryDirectory(prefix="tq-") as tmp:
        address = os.path.join(tmp, "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(address)
            sock.settimeout(5)
            yield address, sock


@pytest.fixture
def abstract_listener() -> Iterator[tuple[str, socket.socket]]:
    name = f"taskq-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        yield "@" + name, sock


@pytest.mark.parametrize("listener", ["path_listener", "abstract_listener"])
def test_messages_arrive_as_one_datagram_each(listener: str, request: pytest.FixtureRequest) -> None:
    address, sock = request.getfixturevalue(listener)
    notifier = Notifier(address)
    assert notifier.ready("2 workers") is True
    assert sock.recv(4096) == b"READY=1\nSTATUS=2 workers"
    assert notifier.watchdog() is True
    assert sock.recv(4096) == b"WATCHDOG=1"
    assert notifier.reloading() is True
    reloading = dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines())
    assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) <= monotonic_usec()
    assert notifier.stopping() is True
    assert sock.recv(4096) == b"STOPPING=1"
    notifier.close()


def test_notify_socket_comes_from_the_environment(
    abstract_listener: tuple[str, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    address, sock = abstract_listener
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = Notifier()
    assert notifier.status("hello") is True
    assert sock.recv(4096) == b"STATUS=hello"
    notifier.close()
