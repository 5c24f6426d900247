"""Forking a worker, and what the child does between fork() and `worker_main` (fork hygiene).

The parent is single-threaded and has no event loop, pool or open connection when it forks. In the
child, in this order: ask the kernel for SIGTERM when the supervisor dies (PR_SET_PDEATHSIG), reset
every signal disposition the supervisor installed, unblock signals, close the supervisor's descriptors
(other workers' liveness pipes, the signal self-pipe, the metrics socket, the notify socket) and those
it inherited from its own parent, drop systemd's notify/watchdog variables, enable faulthandler (so
SIGABRT from the liveness check dumps every thread's stack), set the proctitle, and only then build
the worker, whose pools open inside its own event loop.
"""

from __future__ import annotations

import asyncio
import ctypes
import faulthandler
import logging
import os
import signal
import sys
from collections.abc import Iterable
from typing import Any

from taskq.exitcodes import ExitCode
from taskq.supervisor.proctitle import set_title, worker_title
from taskq.supervisor.sdnotify import CHILD_ENV_SCRUB
from taskq.worker.liveness import ENV_FD, STOP_SIGNALS

log = logging.getLogger("taskq.supervisor")

PR_SET_PDEATHSIG = 1
HANDLED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP,
    signal.SIGTTIN, signal.SIGTTOU, signal.SIGCHLD,
)
TITLE_REFRESH = 1.0


def set_parent_death_signal(sig: int, expected_parent: int) -> None:
    """Linux: deliver `sig` to this process when its parent thread exits. If the supervisor died before
    we got here, the request came too late: stop at once."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
                log.warning("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        except (OSError, AttributeError) as exc:
            log.warning("prctl(PR_SET_PDEATHSIG) unavailable: %s", exc)
    if os.getppid() != expected_parent:
        os._exit(ExitCode.OK)


def child_hygiene(*, parent_pid: int, close_fds: Iterable[int], keep_fds: Iterable[int],
                  hold_stop_signals: bool = False) -> None:
    """Everything a freshly forked child of the supervisor does before running anything else.
    `hold_stop_signals`: a worker child, which unblocks STOP_SIGNALS once it handles them."""
    set_parent_death_signal(signal.SIGTERM, parent_pid)
    signal.set_wakeup_fd(-1)
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, STOP_SIGNALS if hold_stop_signals else set())
    keep = set(keep_fds)
    for fd in close_fds:
        if fd not in keep and fd > 2:
            try:
                os.close(fd)
            except OSError:
                pass
    for name in CHILD_ENV_SCRUB:
        os.environ.pop(name, None)
    try:
        faulthandler.enable(file=sys.stderr, all_threads=True)
    except (AttributeError, ValueError, OSError):
        pass  # no usable stderr: SIGABRT still kills, only without the stack dump


def inherited_fds() -> set[int]:
    """Descriptors this process received from whoever started it (beyond stdio): the inheritable ones.
    Everything Python opens is non-inheritable (PEP 446), so these are not owned by any Python object
    (prometheus_client's open metric files, for one) that could later close the same number again
    after a child reused it."""
    found: set[int] = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if os.get_inheritable(fd):
                found.add(fd)
        except OSError:
            continue  # the directory handle listdir used, already closed
    return found


def worker_exit_code(exc: BaseException) -> int:
    """The documented exit code for an error that ended a worker before or while it ran."""
    from pydantic import ValidationError

    from taskq.exceptions import (
        AppNotImportable,
        ConfigurationError,
        DatabaseUnavailable,
        EmbeddedUnavailable,
        SchemaNotReady,
        SchemaTooNew,
    )

    if isinstance(exc, AppNotImportable):
        return ExitCode.IMPORT_ERROR
    if isinstance(exc, EmbeddedUnavailable):
        return ExitCode.EMBEDDED_UNAVAILABLE
    if isinstance(exc, ValidationError | ConfigurationError):
        return ExitCode.USAGE
    if isinstance(exc, DatabaseUnavailable):
        return ExitCode.DATABASE_UNAVAILABLE
    if isinstance(exc, SchemaNotReady | SchemaTooNew):
        return ExitCode.SCHEMA
    return ExitCode.INTERNAL


async def _run_with_title(settings: Any, registry: Any, number: int) -> int:
    from taskq.worker.main import Worker, worker_main_async

    worker = Worker(settings, registry)

    async def refresh_title() -> None:
        last = ""
        while True:
            title = worker_title(number, settings.queues, len(worker.registry), worker.draining)
            if title != last:
                set_title(title)
                last = title
            await asyncio.sleep(TITLE_REFRESH)

    refresher = asyncio.get_running_loop().create_task(refresh_title(), name="taskq-proctitle")
    try:
        return await worker_main_async(settings, registry, worker=worker)
    finally:
        refresher.cancel()


def run_worker_child(*, app: str, registry: Any, settings: Any, number: int, liveness_fd: int) -> int:
    """The worker's life in the forked child; returns its exit code (the caller os._exit()s with it)."""
    import uvloop

    os.environ[ENV_FD] = str(liveness_fd)
    set_title(worker_title(number, settings.queues, 0))
    try:
        if registry is None:  # --no-preload: import APP now, after the fork
            from taskq.worker.cli import load_app

            registry = load_app(app)
        from taskq.worker.main import tune_gc_for_worker

        tune_gc_for_worker()
        return int(uvloop.run(_run_with_title(settings, registry, number)))
    except KeyboardInterrupt:
        return ExitCode.OK
    except BaseException as exc:
        code = worker_exit_code(exc)
        if code == ExitCode.INTERNAL:
            log.exception("worker %d crashed", number)
        else:
            log.error("worker %d cannot start: %s", number, exc)
        return code


def exit_child(code: int) -> None:
    """Leave a forked child without running the parent's atexit handlers or finalizers."""
    try:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
