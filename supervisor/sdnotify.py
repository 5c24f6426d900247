"""systemd's notify protocol (sd_notify(3)) without python-systemd: one datagram per message on the
AF_UNIX socket named by NOTIFY_SOCKET (a path, or '@name' for the abstract namespace).

Sending never blocks and never raises: a supervisor must not stall or die because systemd (or a test
listening in its place) is slow or gone.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping

log = logging.getLogger("taskq.supervisor.sdnotify")

ENV_SOCKET = "NOTIFY_SOCKET"
ENV_WATCHDOG_USEC = "WATCHDOG_USEC"
ENV_WATCHDOG_PID = "WATCHDOG_PID"
CHILD_ENV_SCRUB = (
    ENV_SOCKET, ENV_WATCHDOG_USEC, ENV_WATCHDOG_PID, "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES",
)
"""What a worker must not inherit: with NotifyAccess=main systemd would drop its messages anyway, and
a worker that believed it owned the watchdog would be wrong."""


def format_message(fields: Mapping[str, object]) -> bytes:
    """`KEY=value` lines in the given order. A value never spans lines (a newline would start a new,
    unintended assignment), so newlines inside values become spaces."""
    lines = []
    for key, value in fields.items():
        if not key or not key.replace("_", "").isalnum() or not key.isupper():
            raise ValueError(f"invalid sd_notify field name {key!r}")
        text = str(int(value)) if isinstance(value, bool) else str(value)
        lines.append(f"{key}={' '.join(text.splitlines())}")
    return "\n".join(lines).encode()


def socket_address(raw: str) -> str:
    """The address to sendto(): '@name' is the abstract namespace (a leading NUL byte)."""
    if raw.startswith("@"):
        return "\0" + raw[1:]
    return raw


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, as RELOADING=1 expects in MONOTONIC_USEC."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def watchdog_interval(env: Mapping[str, str] | None = None, pid: int | None = None) -> float | None:
    """How often to send WATCHDOG=1 (half of WATCHDOG_USEC), or None when the watchdog is off or
    meant for another process (WATCHDOG_PID)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_WATCHDOG_USEC)
    if not raw:
        return None
    owner = env.get(ENV_WATCHDOG_PID)
    if owner and owner.strip() != str(os.getpid() if pid is None else pid):
        return None
    try:
        usec = int(raw)
    except ValueError:
        return None
    return usec / 2_000_000 if usec > 0 else None


class Notifier:
    """Sends notify messages; a no-op when there is no NOTIFY_SOCKET."""

    def __init__(self, address: str | None = None) -> None:
        raw = address if address is not None else os.environ.get(ENV_SOCKET)
        self.address = socket_address(raw) if raw else None
        self._sock: socket.socket | None = None
        self._warned = False
        if self.address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def fileno(self) -> int | None:
        return self._sock.fileno() if self._sock is not None else None

    def send(self, **fields: object) -> bool:
        """Send one message, e.g. `send(READY=1, STATUS="2 workers")`. True if it left."""
        if self._sock is None or self.address is None:
            return False
        try:
            self._sock.sendto(format_message(fields), self.address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                log.warning("sd_notify to %r failed: %s (further failures are not logged)",
                            self.address.replace("\0", "@"), exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.send(READY=1, **({"STATUS": status} if status else {}))

    def reloading(self) -> bool:
        return self.send(RELOADING=1, MONOTONIC_USEC=monotonic_usec())

    def stopping(self, status: str | None = None) -> bool:
        return self.send(STOPPING=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.send(STATUS=text)

    def watchdog(self) -> bool:
        return self.send(WATCHDOG=1)

    def detach_in_child(self) -> None:
        """In a forked worker: forget the socket without touching the parent's copy."""
        if self._sock is not None:
            os.close(self._sock.detach())
            self._sock = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
