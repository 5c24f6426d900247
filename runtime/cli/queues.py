"""`taskq queues [--keys Q]` and `taskq queue pause|resume|limit Q`, `taskq queue weight Q KEY WEIGHT`: the CLI
face of taskq.ops.queues.

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
from taskq.models import FairKeyStats, QueueStatsReport
from taskq.ops.queues import check_limit, check_period, check_queue_name, check_weight_key

ACTIONS = ("pause", "resume", "limit", "weight")
QUEUE_COLUMNS = ("queue", "pending", "scheduled", "running", "awaiting", "failed 1h", "oldest pending",
                 "jobs/s 5m", "state", "limits", "weights")
KEY_COLUMNS = ("key", "ready", "scheduled", "running", "started 1m", "weight")
WEIGHT_AUDIT_ACTION = "queues:limit"
"""The audit action of `taskq queue weight`: a weight is one of the queue's settings, audited as its limits
are (the detail names the key and the weight)."""
NO_KEY = "(no key)"
"""How the empty key (jobs enqueued without a fairness key) is shown."""


def key_label(key: str) -> str:
    return key if key else NO_KEY


def weights_text(weights: dict[str, float]) -> str:
    """`tenant-7=3, (no key)=0.5`, or `-` when every key has the default weight 1."""
    return ", ".join(f"{key_label(k)}={w:g}" for k, w in sorted(weights.items())) or cli_output.NONE


def keys_table(queue: str, keys: list[FairKeyStats]) -> str:
    if not keys:
        return f"no jobs and no weights in queue {queue} (every key has weight 1)"
    return cli_output.table(KEY_COLUMNS, [(key_label(k.key), str(k.ready), str(k.scheduled), str(k.running),
                                           str(k.started_last_minute), f"{k.weight:g}") for k in keys])


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
              f"paused by {q.paused_by}" if q.paused else "active", q.limits.describe(),
              weights_text(q.fairness_weights))
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

    keys = check_queue_name(args.keys) if args.keys is not None else None

    async def body(client: JobsClient) -> int:
        if keys is not None:
            # an unknown name raises QueueNotFound: exit 4, one line (taskq.cli.classify)
            rows = await client.fair_keys(keys)
            emit(cli_output.to_json({"queue": keys, "keys": [r.model_dump(mode="json") for r in rows]})
                 if args.json else keys_table(keys, rows))
            return ExitCode.OK
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


def weight_value(text: str | None) -> float:
    """WEIGHT as given: a finite number > 0 (at most 1,000,000), checked before any connection."""
    from taskq.checks import check_fairness_weight
    from taskq.exceptions import UsageError

    if text is None:
        raise UsageError("weight: give QUEUE KEY WEIGHT (KEY '' for the jobs enqueued without a key)")
    try:
        number = float(text)
    except ValueError:
        raise UsageError(f"weight must be a number greater than 0, got {text!r}") from None
    return check_fairness_weight(number)


async def set_weight(client: JobsClient, args: argparse.Namespace, name: str, key: str, weight: float) -> None:
    done = await client.set_fairness_weight(name, key, weight)
    await audit.record(client, WEIGHT_AUDIT_ACTION, "limited" if done.changed else "unchanged", queue=name,
                       reason=args.reason, detail={"fairness_weight": {"key": key, "weight": weight,
                                                                       "previous": done.previous}})
    if args.json:
        emit(cli_output.to_json(done))
        return
    said = f"{done.weight:g}" + ("" if done.changed else " (unchanged)")
    emit(cli_output.printable(f"{name}: weight of {key_label(key)} {said}; {done.retagged} ready job(s) re-spaced"))


def cmd_queue(args: argparse.Namespace) -> int:
    from taskq.exceptions import UsageError
    from taskq.exitcodes import ExitCode

    name = check_queue_name(args.name)  # a bad name is a usage error before any connection
    if args.action == "limit":
        options = limit_options(args)
    elif any(v is not None for v in (args.concurrency, args.per_key, args.rate, args.period)):
        raise UsageError(f"--concurrency, --per-key, --rate and --period go with 'limit', not {args.action!r}")
    if args.action == "weight":
        if args.key is None:
            raise UsageError("weight: give QUEUE KEY WEIGHT (KEY '' for the jobs enqueued without a key)")
        key = check_weight_key(args.key)
        weight = weight_value(args.weight)
    elif args.key is not None or args.weight is not None:
        raise UsageError(f"KEY and WEIGHT go with 'weight', not {args.action!r}")

    async def body(client: JobsClient) -> int:
        if args.action == "weight":
            await set_weight(client, args, name, key, weight)
            return ExitCode.OK
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
        Command("queues", cmd_queues,
                "list the queues: counts, oldest pending, throughput, pause, limits and fairness weights",
                (arg("--keys", metavar="QUEUE", help="per fairness key of QUEUE: ready, scheduled, running, "
                     "started in the last minute, weight"),
                 JSON_ARG)),
        Command(
            "queue", cmd_queue, "pause, resume, limit one queue across the fleet, or weigh a fairness key",
            (arg("action", choices=ACTIONS, metavar="ACTION", help="pause, resume, limit or weight"),
             arg("name", metavar="QUEUE", help="the queue's name"),
             arg("key", nargs="?", metavar="KEY", help="weight: the fairness key ('' for jobs enqueued without one)"),
             arg("weight", nargs="?", metavar="WEIGHT", help="weight: a number > 0 (default 1; at most 1,000,000)"),
             arg("--reason", help="recorded in the queue's timeline"),
             arg("--concurrency", metavar="N", help="limit: at most N jobs running across all workers ('none' "
                 "removes it)"),
             arg("--per-key", metavar="K", help="limit: at most K running per concurrency key ('none' removes it)"),
             arg("--rate", metavar="N", help="limit: at most N job starts per --period ('none' removes it)"),
             arg("--period", metavar="SECONDS", help="limit: the rate's window in seconds"),
             JSON_ARG),
            description="pause: every worker stops claiming from the queue (running jobs go on, enqueue still "
            "works, the pause is stored). resume: claiming starts again. limit: fleet-wide limits enforced in "
            "the claim; a limit left out is kept. weight QUEUE KEY WEIGHT: the key's jobs get WEIGHT times the "
            "share of starts of a key of weight 1 among the keys with jobs ready (docs/fairness.md). Exit codes: "
            "0 done, 2 bad arguments or values, 4 no such queue (pause, resume, weight).",
        ),
    )
