"""`taskq run APP --workers N` / `python -m taskq.supervisor APP --workers N`: the forking supervisor.

Every WorkerSettings field is accepted as a flag (`--<field-with-dashes>`, or env `TASKQ_<FIELD>`) and
handed to each worker; the flags below are the supervisor's own.

Exit codes (a contract systemd's RestartPreventExitStatus relies on):

    0    stopped by SIGTERM/SIGINT and every worker exited 0 (its jobs finished or were released)
    1    stopped, but a worker exited non-zero or had to be killed (its jobs were reclaimed)
    2    usage: invalid flag or setting, or the metrics port cannot be bound
    3    a worker could not reach PostgreSQL at boot, before the supervisor was ever ready
    5    a worker found the schema missing or too new (run `taskq migrate` / upgrade taskq)
    6    no DSN and the embedded PostgreSQL is unavailable
    10   APP cannot be imported or is not a list/registry of actors
    15   crash loop: --crash-limit workers died within --crash-window seconds

Use `supervisor_command(args)` with a parser prepared by `add_run_arguments(parser)` to embed this in
another CLI; both are synchronous and must run before any event loop exists in the process.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError

from taskq.exitcodes import ExitCode
from taskq.settings import WorkerSettings
from taskq.supervisor.arbiter import Supervisor, SupervisorOptions
from taskq.supervisor.metrics_http import enter_multiprocess_mode, remove_metrics_dir
from taskq.supervisor.proctitle import set_title, supervisor_title
from taskq.supervisor.web_child import WebChild
from taskq.worker.cli import add_settings_flags, configure_logging, describe_validation_error

ENV_WORKERS = "TASKQ_WORKERS"
ERROR_PREFIX = "taskq: error: "


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number (0-65535), got {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, got {text}")
    return value


def _default_workers() -> int:
    raw = os.environ.get(ENV_WORKERS)
    if raw:
        try:
            return _positive_int(raw)
        except (ValueError, argparse.ArgumentTypeError):
            pass
    return max(1, os.cpu_count() or 1)


# (flag, dest, parse, SupervisorOptions field default, help)
_SUPERVISOR_FLAGS: tuple[tuple[str, str, Callable[[str], object], str], ...] = (
    ("--crash-limit", "crash_limit", _positive_int,
     "stop (exit 15) after this many unexpected worker deaths within --crash-window (default 5)"),
    ("--crash-window", "crash_window", _seconds, "seconds (default 60)"),
    ("--restart-backoff", "restart_backoff", _seconds,
     "delay before replacing a dead worker, doubled per recent death (default 0.5)"),
    ("--restart-backoff-max", "restart_backoff_max", _seconds, "cap of that delay (default 30)"),
    ("--kill-grace", "kill_grace", _seconds,
     "a worker silent for worker_timeout gets SIGABRT, then SIGKILL after this many seconds (default 5)"),
    ("--stop-margin", "stop_margin", _seconds,
     "after SIGTERM, SIGKILL a worker still running at shutdown_timeout + this (default 5)"),
    ("--fast-stop-grace", "fast_stop_grace", _seconds,
     "SIGQUIT: SIGTERM the workers, SIGKILL them after this many seconds (default 2)"),
    ("--ready-timeout", "ready_timeout", _seconds,
     "rolling restart: abort if a new worker is not ready within this many seconds (default 60)"),
)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """APP, --workers, the supervisor's options and every WorkerSettings flag. A `--dsn` the parser
    already defines (a global CLI flag) is left to it; supervisor_command reads `args.dsn` too."""
    parser.add_argument("app", metavar="APP", help="module:attribute naming a list or registry of actors")
    group = parser.add_argument_group("supervisor")
    group.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                       help=f"worker processes (default: env {ENV_WORKERS}, else the number of CPUs)")
    for flag, dest, parse, help_text in _SUPERVISOR_FLAGS:
        group.add_argument(flag, dest=f"supervisor_{dest}", type=parse, default=None, help=help_text)
    group.add_argument("--no-preload", dest="supervisor_preload", action="store_false", default=True,
                       help="import APP in each worker after the fork instead of once in the supervisor, "
                            "so SIGHUP (rolling restart) loads new code")
    group.add_argument("--no-metrics", dest="supervisor_metrics", action="store_false", default=True,
                       help="do not serve /metrics, /healthz, /readyz")
    group.add_argument("--web-port", dest="web_port", type=_port, default=None, metavar="PORT",
                       help="also serve the dashboard and /api/v1 (`taskq web`, bearer-token auth) on this port "
                            "from this host; needs the web extra")
    group.add_argument("--web-host", dest="web_host", default="127.0.0.1",
                       help="address of --web-port (default 127.0.0.1)")
    taken = getattr(parser, "_option_string_actions", {})
    add_settings_flags(parser, skip=("dsn",) if "--dsn" in taken else ())


def _explicit_settings(args: argparse.Namespace) -> dict[str, str]:
    values = {
        key.removeprefix("setting_"): str(value)
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    if "dsn" not in values and getattr(args, "dsn", None):
        values["dsn"] = str(args.dsn)
    return values


def _options(args: argparse.Namespace) -> SupervisorOptions:
    given = {
        dest: getattr(args, f"supervisor_{dest}")
        for _flag, dest, _parse, _help in _SUPERVISOR_FLAGS
        if getattr(args, f"supervisor_{dest}", None) is not None
    }
    return SupervisorOptions(
        app=args.app,
        workers=args.workers or _default_workers(),
        preload=getattr(args, "supervisor_preload", True),
        metrics=getattr(args, "supervisor_metrics", True),
        **given,
    )


def _fail(message: str, code: int) -> int:
    print(ERROR_PREFIX + " ".join(message.split()), file=sys.stderr, flush=True)
    return code


def supervisor_command(args: argparse.Namespace) -> int:
    """Run the supervisor from arguments parsed with `add_run_arguments`; returns the exit code."""
    from taskq.dsn import resolve_dsn
    from taskq.exceptions import AppNotImportable, ConfigurationError, EmbeddedUnavailable
    from taskq.supervisor.spawn import inherited_fds
    from taskq.worker.cli import load_app

    raw = _explicit_settings(args)
    try:
        settings = WorkerSettings(**raw)  # type: ignore[arg-type]
        options = _options(args)
    except ValidationError as exc:
        return _fail(describe_validation_error(exc), ExitCode.USAGE)
    set_title(supervisor_title(0, 0, options.app))  # before anything slow: a --dsn on argv leaves `ps` at once
    configure_logging(settings.log_format)
    inherited = inherited_fds()
    if not enter_multiprocess_mode():
        return _fail("prometheus multiprocess mode could not be enabled (PROMETHEUS_MULTIPROC_DIR): "
                     "prometheus_client was imported before the supervisor started", ExitCode.INTERNAL)
    try:
        try:
            dsn = resolve_dsn(settings.dsn_value())
        except EmbeddedUnavailable as exc:
            return _fail(str(exc), ExitCode.EMBEDDED_UNAVAILABLE)
        except (ConfigurationError, OSError) as exc:
            return _fail(str(exc), ExitCode.USAGE)
        registry = None
        if options.preload:
            try:
                registry = load_app(options.app)
            except AppNotImportable as exc:
                return _fail(str(exc), ExitCode.IMPORT_ERROR)
        web_port = getattr(args, "web_port", None)
        web = None if web_port is None else WebChild(
            dsn, args.web_host, web_port, backoff=options.restart_backoff, backoff_max=options.restart_backoff_max,
            window=options.crash_window, app=options.app)
        supervisor = Supervisor(options, settings, dsn, registry, inherited, web)
        try:
            supervisor.bind_metrics()
        except OSError as exc:
            return _fail(f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                         f"{exc.strerror or exc} (set --metrics-port; 0 picks a free port)", ExitCode.USAGE)
        try:
            return supervisor.run()
        finally:
            if web is not None:
                web.stop()  # a no-op after a normal stop; else the child must not outlive us
    finally:
        remove_metrics_dir()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m taskq.supervisor",
        description="Run N taskq workers under a supervisor (the same as `taskq run`).",
        epilog="Signals: TERM/INT stop gracefully, QUIT stops fast, HUP restarts the workers one by one, "
               "TTIN/TTOU add/remove one worker.",
    )
    add_run_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return supervisor_command(build_parser().parse_args(argv))
