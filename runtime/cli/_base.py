"""What every `taskq` command module shares: argument types, the command table's `Command` and `arg`,
and how a command reaches the database (`dsn_of`, `with_client`). Command modules import from here (and
their exit codes and errors from `taskq.exitcodes` and `taskq.exceptions`), never from `taskq.cli`
(which imports them)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from taskq.cli.args import workflow_id_arg
from taskq.client import JobsClient
from taskq.dsn import resolve_dsn
from taskq.embedded import data_dir
from taskq.exceptions import EmbeddedUnavailable, UsageError
from taskq.models import JobFilter, JobStatus

PROG = "taskq"


ERROR_PREFIX = f"{PROG}: error: "


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
WAITING_CHOICES = ["sleep", "signal", "any"]


FILTER_ARGS = (
    arg("--tag", action="append", metavar="TAG", help="jobs carrying this tag (repeat: all of them)"),
    arg("--actor", action="append", metavar="ACTOR", help="jobs of this actor (repeat: any of them)"),
    arg("--queue", action="append", metavar="QUEUE", help="jobs in this queue (repeat: any of them)"),
    arg("--status", action="append", choices=STATUS_CHOICES, metavar="STATUS",
        help=f"jobs in this status (repeat: any of them); one of {', '.join(STATUS_CHOICES)}"),
    arg("--unfinished", action="store_true",
        help="only unfinished jobs (pending, scheduled, awaiting_parents, running)"),
    arg("--workflow", type=workflow_id_arg, metavar="ID",
        help="the members of this workflow (its id: `wf.id` of client.workflow())"),
    arg("--waiting", choices=WAITING_CHOICES,
        help="jobs suspended by ctx.sleep (sleep), ctx.wait_for_signal (signal), or either (any)"),
)


def job_filter(args: argparse.Namespace) -> JobFilter | None:
    """The JobFilter the filter options describe, or None when none was given."""
    given = {
        "tags": args.tag,
        "actors": args.actor,
        "queues": args.queue,
        "statuses": args.status,
    }
    workflow, waiting = getattr(args, "workflow", None), getattr(args, "waiting", None)
    if not any(given.values()) and not args.unfinished and workflow is None and waiting is None:
        return None
    try:
        return JobFilter(
            **{k: tuple(v) for k, v in given.items() if v}, unfinished=args.unfinished, workflow_id=workflow,
            waiting=waiting,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        raise UsageError(f"invalid filter: {where + ': ' if where else ''}{message}") from None


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

