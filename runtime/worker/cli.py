"""`taskq worker APP`: run one worker process in the foreground.

APP is `module:attribute` naming a list of actors, an ActorRegistry, or a single actor. Every
WorkerSettings field has a flag `--<field-with-dashes>` (and env `TASKQ_<FIELD>`); flags win.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any

from pydantic import ValidationError

from taskq.actors.declaration import ActorRegistry, as_registry
from taskq.exceptions import ActorDefinitionError, AppNotImportable
from taskq.exitcodes import ExitCode
from taskq.settings import WorkerSettings


def load_app(spec: str) -> ActorRegistry:
    """The actors APP (`module:attribute`) names; AppNotImportable if it cannot be imported or names none."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppNotImportable(f"APP must look like 'package.module:attribute', got {spec!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # like gunicorn/uvicorn: APP is found from where you run taskq
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise AppNotImportable(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    try:
        value: Any = module
        for part in attr.split("."):
            value = getattr(value, part)
    except AttributeError:
        raise AppNotImportable(f"module {module_name!r} has no attribute {attr!r}") from None
    try:
        registry = as_registry(value)
    except ActorDefinitionError as exc:
        raise AppNotImportable(f"{spec}: {exc}") from None
    if registry.owner is None:
        registry.owner = spec  # whose schedules these are: the ones it stops declaring get disabled
    return registry


def add_settings_flags(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    group = parser.add_argument_group("worker settings (each also from env TASKQ_<FIELD>)")
    for name, field in WorkerSettings.model_fields.items():
        if name in skip:
            continue
        flag = "--" + name.replace("_", "-")
        group.add_argument(flag, dest=f"setting_{name}", default=None, metavar=name.upper(),
                           help=(field.description or "").strip() or None)


def settings_from_args(args: argparse.Namespace) -> WorkerSettings:
    values = {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    return WorkerSettings(**values)


def describe_validation_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    return f"invalid setting {loc}: {message}" if loc else f"invalid settings: {message}"


def configure_logging(log_format: str = "text") -> None:
    from taskq.logs import configure_logging as configure

    configure(log_format)


def set_worker_title(app: str, settings: WorkerSettings) -> None:
    """Replace the command line `ps` shows (and /proc/<pid>/cmdline) with a title built from APP and
    the queues: a `--dsn` typed on the command line, and its password, stop being visible to others."""
    import setproctitle

    setproctitle.setproctitle(f"taskq worker [q={','.join(settings.queues)}] {app}")


def run_worker(app: str, settings: WorkerSettings) -> int:
    """Import APP and run a worker on uvloop; returns the process exit code."""
    from taskq.worker.main import worker_main

    registry = load_app(app)
    return worker_main(settings, registry)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="taskq worker", description="Run one taskq worker.")
    parser.add_argument("app", metavar="APP", help="module:attribute naming a list or registry of actors")
    add_settings_flags(parser)
    return parser


def command(args: argparse.Namespace) -> int:
    """Run `taskq worker` from parsed arguments; user errors print one line and return an exit code."""
    from taskq.exceptions import (
        ConfigurationError,
        DatabaseUnavailable,
        EmbeddedUnavailable,
        SchemaNotReady,
        SchemaTooNew,
    )

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        print(f"taskq: error: {describe_validation_error(exc)}", file=sys.stderr)
        return ExitCode.USAGE
    set_worker_title(args.app, settings)
    configure_logging(settings.log_format)
    try:
        return run_worker(args.app, settings)
    except AppNotImportable as exc:
        print(f"taskq: error: {exc}", file=sys.stderr)
        return ExitCode.IMPORT_ERROR
    except DatabaseUnavailable as exc:
        print(f"taskq: error: {exc}", file=sys.stderr)
        return ExitCode.DATABASE_UNAVAILABLE
    except (SchemaNotReady, SchemaTooNew) as exc:
        print(f"taskq: error: {exc}", file=sys.stderr)
        return ExitCode.SCHEMA
    except EmbeddedUnavailable as exc:
        print(f"taskq: error: {exc}", file=sys.stderr)
        return ExitCode.EMBEDDED_UNAVAILABLE
    except ConfigurationError as exc:  # e.g. a DSN that cannot be parsed
        print(f"taskq: error: {exc}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:
        return ExitCode.OK


def main(argv: list[str] | None = None) -> int:
    return command(build_parser().parse_args(argv))
