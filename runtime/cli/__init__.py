"""The `taskq` command line: migrate the schema, enqueue, list, inspect, cancel and requeue jobs.

    taskq [--dsn DSN] COMMAND [OPTIONS]

The database is `--dsn` (before or after the command), else env `TASKQ_DSN`, else the embedded
PostgreSQL in `TASKQ_DATA_DIR` (started on first use). `python -m taskq.cli` works the same way.

Exit codes are a contract (scripts, CI and supervisors branch on them). Their one table, shared with
the worker and the supervisor, is `taskq.exitcodes.ExitCode` (exported here too); docs/deploy.md#exit-codes
shows it to operators. The errors that choose a command's code (`CliError` and its subclasses) live in
`taskq.exceptions` with every other.

Every error is ONE line on stderr starting with "taskq: error: "; never a traceback (unless
TASKQ_DEBUG=1), never a password: DSNs are shown through `redact_dsn`, and any password the user
supplied is scrubbed from every message before it is printed.

Adding a command: write `def cmd_x(args: argparse.Namespace) -> int` and its `Command(...)` in the
module of its noun (`taskq.cli.jobs`, `.queues`, `.schedules`, ...), built from `taskq.cli._base`, and
name it in COMMANDS. Command modules import `taskq.cli._base`, never this module, which imports them.
Handlers are synchronous on purpose: a command that forks (the supervisor) must do so before any event
loop exists; the others call `asyncio.run` themselves.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

import psycopg
from psycopg_pool import PoolTimeout

from taskq.cli import bench, database, doctor, durable, jobs, lifecycle, prune, queues, schedules, tokens, web, worker
from taskq.cli._base import ERROR_PREFIX, PROG, Command
from taskq.dsn import scrub
from taskq.embedded import INSTALL_HINT
from taskq.exceptions import (
    ActorDefinitionError,
    AppNotImportable,
    CliError,
    ConfigurationError,
    DatabaseUnavailable,
    DependencyNotFound,
    EmbeddedUnavailable,
    NotFound,
    PayloadInvalid,
    QueueNotFound,
    ScheduleNotFound,
    SchemaNotReady,
    SchemaTooNew,
    TaskqError,
    TokenExists,
    TokenNotFound,
    UsageError,
)
from taskq.exitcodes import ExitCode

__all__ = [
    "COMMANDS",
    "AppNotImportable",
    "CliError",
    "Command",
    "ExitCode",
    "NotFound",
    "UsageError",
    "build_parser",
    "classify",
    "main",
]

COMMANDS: tuple[Command, ...] = (
    database.MIGRATE,
    database.DSN,
    doctor.DOCTOR,
    bench.BENCH,
    jobs.ENQUEUE,
    jobs.CANCEL,
    *lifecycle.commands(),
    jobs.JOBS,
    jobs.JOB,
    *durable.commands(),
    *schedules.commands(),
    *queues.commands(),
    *prune.commands(),
    *tokens.commands(),
    *web.commands(),
    worker.WORKER,
    worker.RUN,
)


# -- parser and error reporting -------------------------------------------------------------------


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become a UsageError (one line, exit 2) instead of usage + exit."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser(commands: Sequence[Command] = COMMANDS) -> Parser:
    from taskq import __version__

    # --dsn is accepted before or after the command; SUPPRESS keeps a sub-parser from resetting it
    dsn_after = Parser(add_help=False)
    dsn_after.add_argument("--dsn", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    parser = Parser(
        prog=PROG,
        description="taskq: a PostgreSQL-backed job queue. Exit codes: 0 ok, 1 internal error, 2 usage, "
        "3 database unreachable, 4 not found, 5 schema not ready, 6 embedded PostgreSQL unavailable.",
    )
    parser.add_argument(
        "--dsn", default=None,
        help="PostgreSQL DSN (default: env TASKQ_DSN, else the embedded server in TASKQ_DATA_DIR)",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in commands:
        p = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            parents=[dsn_after],
        )
        for a in command.args:
            p.add_argument(*a.flags, **a.options)
        if command.configure is not None:
            command.configure(p)
        p.set_defaults(handler=command.run)
    return parser


def classify(exc: BaseException) -> tuple[ExitCode, str]:
    """The exit code and the one-line message for an exception that ended a command."""
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, EmbeddedUnavailable):  # before ConfigurationError: it is one
        message = str(exc)
        if INSTALL_HINT not in message:
            message += f" (the embedded server needs {INSTALL_HINT}; or set TASKQ_DSN / --dsn to use another)"
        return ExitCode.EMBEDDED_UNAVAILABLE, message
    if isinstance(exc, DatabaseUnavailable):
        return ExitCode.DATABASE_UNAVAILABLE, str(exc)
    if isinstance(exc, TokenExists):
        return ExitCode.CONFLICT, str(exc)
    if isinstance(exc, ScheduleNotFound | TokenNotFound | DependencyNotFound | QueueNotFound):
        return ExitCode.NOT_FOUND, str(exc)
    if isinstance(exc, SchemaNotReady | SchemaTooNew):
        return ExitCode.SCHEMA, str(exc)
    if isinstance(exc, ConfigurationError | PayloadInvalid | ActorDefinitionError):
        return ExitCode.USAGE, str(exc)
    if isinstance(exc, psycopg.OperationalError | PoolTimeout):
        return ExitCode.DATABASE_UNAVAILABLE, f"lost the connection to PostgreSQL: {exc}"
    if isinstance(exc, TaskqError):
        return ExitCode.INTERNAL, str(exc)
    return (
        ExitCode.INTERNAL,
        f"internal error: {type(exc).__name__}: {exc} (set TASKQ_DEBUG=1 for the traceback)",
    )


def _debug() -> bool:
    return os.environ.get("TASKQ_DEBUG", "").strip().lower() not in ("", "0", "false", "no")


def report(exc: BaseException, dsns: Sequence[str | None]) -> ExitCode:
    code, message = classify(exc)
    if _debug():
        sys.stderr.write(scrub("".join(traceback.format_exception(exc)), dsns))
    one_line = " ".join(message.split()) or type(exc).__name__
    print(ERROR_PREFIX + scrub(one_line, dsns), file=sys.stderr, flush=True)
    return code


def _silence_stdout() -> None:
    """After EPIPE, point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `taskq` command; returns its exit code (the console script passes it to sys.exit)."""
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    dsns: list[str | None] = [os.environ.get("TASKQ_DSN")]
    # the raw --dsn as typed, so even a value argparse rejects is scrubbed from the message
    for i, token in enumerate(raw_argv):
        if token == "--dsn" and i + 1 < len(raw_argv):
            dsns.append(raw_argv[i + 1])
        elif token.startswith("--dsn="):
            dsns.append(token.removeprefix("--dsn="))
    try:
        args = build_parser().parse_args(raw_argv)
        return int(args.handler(args))
    except KeyboardInterrupt:
        print(ERROR_PREFIX + "interrupted", file=sys.stderr, flush=True)
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        _silence_stdout()
        return ExitCode.BROKEN_PIPE
    except Exception as exc:
        return report(exc, dsns)

