"""`taskq requeue`: the operator's requeue of failed, crashed or abandoned jobs, by id or by filters.

Registered in `taskq.cli.COMMANDS` through `commands()`; built from `taskq.cli._base`, like every
command module (taskq.cli imports them, never the reverse).
"""

from __future__ import annotations

import argparse
from uuid import UUID

from taskq.checks import check_reason
from taskq.cli import _audit as audit
from taskq.cli import output as cli_output
from taskq.cli._base import FILTER_ARGS, JSON_ARG, Command, arg, emit, job_filter, with_client
from taskq.cli.progress import ProgressLine
from taskq.client import JobsClient
from taskq.ops.jobs import MAX_REQUEUE_ATTEMPTS


def cmd_requeue(args: argparse.Namespace) -> int:
    from taskq.exceptions import NotFound, UsageError
    from taskq.exitcodes import ExitCode

    flt = job_filter(args)
    if args.job_id is not None and flt is not None:
        raise UsageError("give either a job ID or filters (--tag, --actor, --queue, --status), not both")
    if args.job_id is None and flt is None:
        raise UsageError("give a job ID, or filters such as --tag T or --status failed to requeue every match")
    reason = check_reason(args.reason)
    job_id: UUID | None = args.job_id

    async def body(client: JobsClient) -> int:
        if job_id is not None:
            try:
                result = await client.requeue(job_id, reason=reason, attempts=args.attempts, cascade=args.cascade,
                                              reset_steps=args.reset_steps)
            except KeyError:
                raise NotFound(f"no job with id {job_id}") from None
            held_by = {"conflict_job_id": str(result.conflict_job_id)} if result.conflict_job_id else None
            await audit.record(client, "jobs:requeue", "requeued" if result.requeued else "conflict", job_id=job_id,
                               reason=reason, detail=held_by)
            emit(cli_output.to_json(result) if args.json else cli_output.requeue_summary(result))
            return ExitCode.OK
        assert flt is not None
        line = ProgressLine("requeue", enabled=not args.json)
        try:
            bulk = await client.requeue_where(flt, reason=reason, attempts=args.attempts, progress=line.update,
                                              cascade=args.cascade, reset_steps=args.reset_steps)
        finally:
            line.finish()
        await audit.record(client, "jobs:requeue", "requeued" if bulk.job_ids else "unchanged", reason=reason,
                           detail=audit.bulk_detail(bulk.by_previous_status, bulk.job_ids))
        emit(cli_output.to_json(bulk) if args.json else cli_output.bulk_requeue_summary(bulk))
        return ExitCode.OK

    return with_client(args, body)


def commands() -> tuple[Command, ...]:
    from taskq.cli.args import int_arg, job_id_arg

    return (
        Command(
            "requeue", cmd_requeue, "put failed, crashed or abandoned jobs back in the queue, by id or filters",
            (
                arg("job_id", nargs="?", type=job_id_arg, metavar="ID", help="the job to requeue"),
                arg("--reason", help="recorded on the job's timeline"),
                arg("--attempts", type=int_arg(1, MAX_REQUEUE_ATTEMPTS), metavar="N",
                    help="attempts the rerun may use (default: the job's own max_attempts; a client that "
                    "registers the actor uses the actor's)"),
                arg("--cascade", action="store_true",
                    help="also bring back the jobs the dependency cascade cancelled because of it "
                    "(ParentFailed): they wait for it again"),
                arg("--reset-steps", action="store_true",
                    help="start the rerun over: forget the steps, sleeps and waits its earlier attempts stored "
                    "(by default completed steps return their stored results instead of running again)"),
                *FILTER_ARGS,
                JSON_ARG,
            ),
            description="Only failed, crashed and abandoned jobs are requeued: they become pending, due now, "
            "with a fresh budget of attempts; attempt numbers carry on (never reset). Any other status, or a "
            "unique key another job holds, leaves the job unchanged. Give an ID, or filters (not both): "
            "filters requeue every matching job in committed batches, with a progress line on a terminal. "
            "Exit codes: 0 done (also nothing to requeue), 2 bad arguments or malformed ID, 4 no such job.",
        ),
    )
