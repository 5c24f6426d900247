"""`taskq queues` and `taskq queue pause|resume|limit Q`: the CLI face of taskq.ops.queues.

Registered in `taskq.cli.COMMANDS` through `commands()`; errors follow its contract (2 usage, 4 no such
queue). Built from `taskq.cli._base` (taskq.cli imports this module, never the reverse).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from taskq.backend.queues import UNSET
from taskq.cli import _audit as audit
from taskq.cli import output as cli_output
from taskq.cli._base import JSON_ARG, Command, arg, emit, with_client
from taskq.client import JobsClient
from taskq.models import QueueStatsReport
from taskq.ops.queues import check_limit, check_period, check_queue_name

ACTIONS = ("pause", "resume", "limit")
QUEUE_COLUMNS = ("queue", "pending", "scheduled", "running", "awaiting", "failed 1h", "oldest pending",
                 "jobs/s 5m", "state", "limits")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return cli_output.NONE
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    return f"{seconds / 3600:.1f}h"


def queues_table(report: QueueStatsReport) -> str:
    if not report.queues:
        text = "no queues yet (a queue appears when a worker serves it or a job is waiting in it)"
    else:
        text = cli_output.table(
            QUEUE_COLUMNS,
            [(q.name, str(q.pending), str(q.scheduled), str(q.running), str(q.awaiting_parents),
              str(q.failed_last_hour), _age(q.oldest_pending_age), f"{q.throughput:.2f}",
              f"paused by {q.paused_by}" if q.paused else "active", q.limits.describe())
             for q in report.queues],
        )
    if report.actor_limits:
        text += "\n\nactor limits\n" + cli_output.table(
            ("actor", "running", "limits", "declared by"),
            [(a.actor, str(a.running), a.limits.describe(), a.declared_by or cli_output.NONE)
             for a in report.actor_limits],
        )
    return text


def cmd_queues(args: argparse.Namespace) -> int:
    from taskq.exitcodes import ExitCode

    async def body(client: JobsClient) -> int:
        report = await client.queue_stats()
        emit(cli_output.to_json(report) if args.json else queues_table(report))
        return ExitCode.OK

    return with_client(args, body)


def _limit_value(text: str | None, name: str, *, period: bool = False) -> Any:
    """A flag's value: left out (UNSET), 'none' (remove the limit), or a checked number."""
    from taskq.exceptions import UsageError

    if text is None:
        return UNSET
    if text.strip().lower() == "none":
        return None
    try:
        number = float(text) if period else int(text)
    except ValueError:
        raise UsageError(f"--{name} must be {'a number of seconds' if period else 'a whole number'} "
                         f"or 'none', got {text!r}") from None
    if period:
        return check_period("--period", number)
    return check_limit(f"--{name}", number)


def limit_options(args: argparse.Namespace) -> dict[str, Any]:
    """The limits the flags set, checked before any connection (a bad one is a usage error, exit 2)."""
    from taskq.exceptions import UsageError

    rate = _limit_value(args.rate, "rate")
    period = _limit_value(args.period, "period", period=True)
    options = {"concurrency": _limit_value(args.concurrency, "concurrency"),
               "concurrency_per_key": _limit_value(args.per_key, "per-key")}
    if rate is None:
        options |= {"rate_limit": None}
    elif rate is not UNSET or period is not UNSET:
        if rate is UNSET or period in (UNSET, None) or (isinstance(period, float) and not math.isfinite(period)):
            raise UsageError("a rate limit needs both --rate N and --period SECONDS (or --rate none to remove it)")
        options |= {"rate_limit": rate, "rate_period": period}
    options = {k: v for k, v in options.items() if v is not UNSET}
    if not options:
        raise UsageError("give at least one of --concurrency, --per-key, --rate with --period")
    return options


def cmd_queue(args: argparse.Namespace) -> int:
    from taskq.exceptions import UsageError
    from taskq.exitcodes import ExitCode

    name = check_queue_name(args.name)  # a bad name is a usage error before any connection
    if args.action == "limit":
        options = limit_options(args)
    elif any(v is not None for v in (args.concurrency, args.per_key, args.rate, args.period)):
        raise UsageError(f"--concurrency, --per-key, --rate and --period go with 'limit', not {args.action!r}")

    async def body(client: JobsClient) -> int:
        if args.action == "limit":
            done = await client.set_queue_limits(name, reason=args.reason, **options)
            await audit.record(client, "queues:limit", "limited", queue=name, reason=args.reason,
                               detail={"limits": done.limits.model_dump(mode="json")})
            emit(cli_output.to_json(done) if args.json else f"{name}: {done.limits.describe()}")
            return ExitCode.OK
        # an unknown name raises QueueNotFound: exit 4, one line (taskq.cli.classify)
        action = client.pause_queue if args.action == "pause" else client.resume_queue
        result = await action(name, reason=args.reason)
        await audit.record(client, f"queues:{args.action}", audit.pause_outcome(result.paused, result.changed),
                           queue=name, reason=args.reason)
        emit(cli_output.to_json(result) if args.json else cli_output.pause_line(name, result.paused, result.changed))
        return ExitCode.OK

    return with_client(args, body)


def commands() -> tuple[Command, ...]:
    return (
        Command("queues", cmd_queues, "list the queues: counts, oldest pending, throughput, pause and limits",
                (JSON_ARG,)),
        Command(
            "queue", cmd_queue, "pause, resume or limit one queue across the fleet",
            (arg("action", choices=ACTIONS, metavar="ACTION", help="pause, resume or limit"),
             arg("name", metavar="QUEUE", help="the queue's name"),
             arg("--reason", help="recorded in the queue's timeline"),
             arg("--concurrency", metavar="N", help="limit: at most N jobs running across all workers ('none' "
                 "removes it)"),
             arg("--per-key", metavar="K", help="limit: at most K running per concurrency key ('none' removes it)"),
             arg("--rate", metavar="N", help="limit: at most N job starts per --period ('none' removes it)"),
             arg("--period", metavar="SECONDS", help="limit: the rate's window in seconds"),
             JSON_ARG),
            description="pause: every worker stops claiming from the queue (running jobs go on, enqueue still "
            "works, the pause is stored). resume: claiming starts again. limit: fleet-wide limits enforced in "
            "the claim; a limit left out is kept. Exit codes: 0 done, 2 bad arguments or values, 4 no such "
            "queue (pause, resume).",
        ),
    )
