"""Process titles (what `ps` and `top` show). Built only from counts, queue names and APP: never from a
DSN or anything else that may carry a password. Setting a title also overwrites the original argv, so
a `--dsn` typed on the command line stops showing in /proc/<pid>/cmdline."""

from __future__ import annotations

from collections.abc import Sequence

import setproctitle


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def supervisor_title(workers: int, in_flight: int, app: str, phase: str | None = None) -> str:
    """`taskq supervisor [2 workers, 5 in flight] examples.app:actors` (+ ` stopping` / ` reloading`)."""
    title = f"taskq supervisor [{_plural(workers, 'worker')}, {in_flight} in flight]"
    if phase:
        title += f" {phase}"
    return f"{title} {app}"


def worker_title(number: int, queues: Sequence[str], running: int, draining: bool = False) -> str:
    """`taskq worker 3 [q=default, 4 running]` (`, draining` once it is shutting down)."""
    state = ", draining" if draining else ""
    return f"taskq worker {number} [q={','.join(queues)}, {running} running{state}]"


def helper_title(address: str) -> str:
    return f"taskq metrics [{address}]"


def set_title(title: str) -> None:
    setproctitle.setproctitle(title)
