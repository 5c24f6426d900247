"""`taskq worker APP` (one worker in the foreground) and `taskq run APP` (the supervisor, which
contributes its own arguments and command body: `taskq.supervisor.main`)."""

from __future__ import annotations

import argparse

from taskq.cli._base import Command, arg, settings_args, worker_settings


def cmd_worker(args: argparse.Namespace) -> int:
    from taskq.worker.cli import configure_logging, load_app, set_worker_title
    from taskq.worker.main import worker_main

    settings = worker_settings(args)
    set_worker_title(args.app, settings)  # before anything slow: a --dsn on argv leaves `ps` at once
    registry = load_app(args.app)  # AppNotImportable: exit code 10, its message as the one line
    configure_logging(settings.log_format)
    return worker_main(settings, registry)


def configure_run(parser: argparse.ArgumentParser) -> None:
    from taskq.supervisor.main import add_run_arguments

    add_run_arguments(parser)


def cmd_run(args: argparse.Namespace) -> int:
    """The supervisor: it forks its workers before any event loop exists, so nothing async runs here."""
    from taskq.supervisor.main import supervisor_command

    return supervisor_command(args)


APP_ARG = arg("app", metavar="APP", help="module:attribute naming a list or registry of actors "
              "(the current directory is importable, as with gunicorn and uvicorn)")


WORKER = Command(
        "worker", cmd_worker, "run one worker in the foreground",
        (APP_ARG, *settings_args()),
        description="Run one worker process: claims jobs of its queues and runs APP's actors. SIGTERM or "
        "SIGINT release in-flight jobs back to the queue (a second SIGINT skips the grace). "
        "Worker exit codes: 0 clean stop, 10 APP not importable, "
        "12 leases lost (database unreachable for lock_timeout while holding jobs), 13 shutdown watchdog fired, "
        "14 restarted to reclaim leaked actor threads.",
    )

RUN = Command(
        "run", cmd_run, "run the supervisor: N workers as a production service (systemd Type=notify)",
        configure=configure_run,
        description="Fork N workers and keep them alive: liveness checks, restarts with backoff, rolling "
        "restart on SIGHUP, SIGTTIN/SIGTTOU to add/remove a worker, sd_notify, and /metrics, /healthz, "
        "/readyz on metrics_host:metrics_port. See docs/deploy.md.",
    )
