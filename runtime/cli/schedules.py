"""`taskq schedules` and `taskq schedule pause|resume|trigger NAME`: the CLI face of taskq.ops.schedules.

Registered in `taskq.cli.COMMANDS` through `commands()`; errors follow its contract (2 usage, 4 no such
schedule). Built from `taskq.cli._base` (taskq.cli imports this module, never the reverse).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from taskq.cli import _audit as audit
from taskq.cli import output as cli_output
from taskq.cli._base import JSON_ARG, Command, arg, emit, with_client
from taskq.client import JobsClient
from taskq.models import ScheduleInfo
from taskq.ops.schedules import check_schedule_name

ACTIONS = ("pause", "resume", "trigger")
SCHEDULE_COLUMNS = ("name", "schedule", "timezone", "next run (UTC)", "last run (UTC)", "last outcome", "enabled")


def describe(s: ScheduleInfo) -> str:
    return s.cron if s.cron is not None else f"every {s.every_seconds}s"


def state(s: ScheduleInfo) -> str:
    if not s.enabled:
        return "no (gone from code)"
    return "paused" if s.paused else "yes"


def outcome(s: ScheduleInfo) -> str | None:
    """The last job's status when the last tick made one; otherwise what the scheduler decided."""
    if s.last_outcome in ("enqueued", "triggered") and s.last_job_status is not None:
        return s.last_job_status.value
    return s.last_outcome


def schedules_table(rows: Sequence[ScheduleInfo]) -> str:
    if not rows:
        return "no schedules (declare them in the APP a worker runs)"
    return cli_output.table(
        SCHEDULE_COLUMNS,
        [(s.name, describe(s), s.timezone, cli_output.when(s.next_run_at), cli_output.when(s.last_run_at),
          outcome(s), state(s)) for s in rows],
    )


def cmd_schedules(args: argparse.Namespace) -> int:
    from taskq.exitcodes import ExitCode

    async def body(client: JobsClient) -> int:
        rows = await client.list_schedules()
        emit(cli_output.to_json(rows) if args.json else schedules_table(rows))
        return ExitCode.OK

    return with_client(args, body)


def cmd_schedule(args: argparse.Namespace) -> int:
    from taskq.exitcodes import ExitCode

    name = check_schedule_name(args.name)  # a bad name is a usage error before any connection

    async def body(client: JobsClient) -> int:
        # an unknown name raises ScheduleNotFound: exit 4, one line (taskq.cli.classify)
        if args.action == "trigger":
            made = await client.trigger_schedule(name)
            await audit.record(client, "schedules:trigger", "triggered", job_id=made.job_id, schedule=name)
            emit(cli_output.to_json(made) if args.json else str(made.job_id))
            return ExitCode.OK
        result = await (client.pause_schedule(name) if args.action == "pause" else client.resume_schedule(name))
        await audit.record(client, f"schedules:{args.action}", audit.pause_outcome(result.paused, result.changed),
                           schedule=name)
        emit(cli_output.to_json(result) if args.json else cli_output.pause_line(name, result.paused, result.changed))
        return ExitCode.OK

    return with_client(args, body)


def commands() -> tuple[Command, ...]:
    return (
        Command("schedules", cmd_schedules, "list the periodic schedules: next and last run, state", (JSON_ARG,)),
        Command(
            "schedule", cmd_schedule, "pause, resume or trigger one schedule",
            (arg("action", choices=ACTIONS, metavar="ACTION", help="pause, resume or trigger"),
             arg("name", metavar="NAME", help="the schedule's name"), JSON_ARG),
            description="pause: make no slot job until resumed. resume: make them again (the slots passed "
            "meanwhile are misfires, handled by the schedule's misfire policy). trigger: enqueue one job now, "
            "outside the slot sequence, even when paused; prints its id. Exit codes: 0 done, 2 bad arguments "
            "or name, 4 no such schedule.",
        ),
    )
