"""`python manage.py taskq_worker [--workers N] [taskq worker flags]`: a taskq worker (or, with
--workers, the supervisor and N workers) running this project's Django tasks. The flags after the
command's own are `taskq worker`'s (`taskq worker --help`); the database defaults to the TASKS backend's."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

APP = "taskq.contrib.django.worker:actors"


class Command(BaseCommand):
    help = "Run a taskq worker for this project's Django tasks (the flags of `taskq worker` apply)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=None,
                            help="run the supervisor with this many worker processes (`taskq run`)")
        parser.add_argument("--backend", default="default", help="the TASKS alias whose database to use")
        parser.add_argument("taskq_args", nargs="*", help="flags for `taskq worker` / `taskq run`, after --")

    def handle(self, *args: Any, **options: Any) -> None:
        from taskq.cli import main
        from taskq.contrib.django.backend import TaskqBackend, dsn_of

        try:
            from django.tasks import task_backends
        except ImportError:
            from django_tasks import task_backends

        backend = task_backends[options["backend"]]
        extra = list(options["taskq_args"])
        if not isinstance(backend, TaskqBackend):
            raise SystemExit(f"taskq: error: TASKS[{options['backend']!r}] is not a TaskqBackend")
        if "--dsn" not in extra:
            extra = ["--dsn", backend.dsn or dsn_of(backend.database or "default"), *extra]
        if options["workers"] is not None:
            code = main(["run", APP, "--workers", str(options["workers"]), *extra])
        else:
            code = main(["worker", APP, *extra])
        raise SystemExit(code)
