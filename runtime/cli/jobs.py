"""`taskq enqueue`, `taskq cancel`, `taskq jobs` and `taskq job`."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from uuid import UUID

from taskq.actors.declaration import default_registry
from taskq.checks import check_reason
from taskq.cli import _audit as audit
from taskq.cli import dependencies as cli_dependencies
from taskq.cli import output as cli_output
from taskq.cli._base import FILTER_ARGS, JSON_ARG, PROG, Command, arg, emit, job_filter, read_payload, with_client
from taskq.cli.args import int_arg, job_id_arg, seconds_arg, when_arg
from taskq.client import JobHandle, JobsClient
from taskq.enqueue import DEFAULT_MAX_PAYLOAD_BYTES, prepare_insert
from taskq.exceptions import NotFound, UsageError, WorkflowNotFound
from taskq.exitcodes import ExitCode
from taskq.models import UNIQUE_SCOPES, JobFilter, JobStatus
from taskq.ops import queues

DEFAULT_JOBS_LIMIT = 50


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
        "fairness_key": args.fairness_key,
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
    if args.workflow is not None:
        return cancel_workflow(args)
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
            outcome = "conflict" if not result.cancellation_initiated else (
                "cancel_requested" if result.new_status == JobStatus.RUNNING else "cancelled")
            await audit.record(client, "jobs:cancel", outcome, job_id=job_id, reason=reason)
            emit(cli_output.to_json(result) if args.json else cli_output.cancel_summary(result))
        else:
            assert flt is not None
            bulk = await client.cancel_where(flt, reason=reason)
            await audit.record(client, "jobs:cancel", "cancelled" if bulk.job_ids else "unchanged", reason=reason,
                               detail=audit.bulk_detail(bulk.by_previous_status, bulk.job_ids))
            emit(cli_output.to_json(bulk) if args.json else cli_output.bulk_cancel_summary(bulk))
        return ExitCode.OK

    return with_client(args, body)


def cancel_workflow(args: argparse.Namespace) -> int:
    """`taskq cancel --workflow ID`: every unfinished member of the workflow, counted per outcome."""
    others = [f"--{name}" for name in ("tag", "actor", "queue", "status") if getattr(args, name)]
    others += ["--unfinished"] if args.unfinished else []
    others += ["--waiting"] if args.waiting else []
    if args.job_id is not None or others:
        raise UsageError("--workflow cancels the whole workflow: give no job ID and no other filter "
                         f"(got {', '.join(others) or 'a job ID'}); `taskq jobs --workflow ID` lists its members")
    reason = check_reason(args.reason)
    workflow_id: UUID = args.workflow

    async def body(client: JobsClient) -> int:
        try:
            result = await client.cancel_workflow(workflow_id, reason=reason)
        except WorkflowNotFound:
            raise NotFound(f"no job belongs to workflow {workflow_id}") from None
        await audit.record(client, "jobs:cancel", "cancelled" if result.job_ids else "unchanged", reason=reason,
                           detail={"workflow_id": str(workflow_id), "members": result.members,
                                   "cancelled": result.cancelled, "cancel_requested": result.cancel_requested,
                                   "job_ids": [str(i) for i in result.job_ids[:100]]})
        emit(cli_output.to_json(result) if args.json else cli_output.workflow_cancel_summary(result))
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
        waiting = cli_output.suspension(handle.row) or await queues.job_wait_reason(client.backend, job_id)
        steps = await client.steps(job_id)
        signals = await client.signals(job_id)
        if args.json:
            emit(cli_output.to_json({"job": handle.row, "events": events, "attempts": attempts,
                                     "dependencies": cli_dependencies.to_plain(edges), "waiting": waiting,
                                     "steps": steps, "signals": signals}))
        else:
            emit(cli_output.job_detail(handle.row, events, attempts, waiting=waiting) + "\n\n"
                 + cli_output.durable_sections(steps, signals) + "\n\n"
                 + cli_output.printable(cli_dependencies.section(edges), newlines=True))
        return ExitCode.OK

    return with_client(args, body)


ENQUEUE = Command(
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
            arg("--fairness-key", metavar="KEY",
                help="the key of fair share inside the queue (e.g. a tenant): starts are shared among the keys "
                "with jobs ready, by weight (taskq queue weight; docs/fairness.md)"),
            JSON_ARG,
        ),
    )

CANCEL = Command(
        "cancel", cmd_cancel, "cancel one job by id, or every unfinished job matching filters",
        (
            arg("job_id", nargs="?", type=job_id_arg, metavar="ID", help="the job to cancel"),
            arg("--reason", help="recorded on the job and its timeline"),
            *FILTER_ARGS,
            JSON_ARG,
        ),
        description="Pending and scheduled jobs end cancelled at once (CancelledBeforeStart); running jobs "
        "get a cancel request their worker acts on. Give an ID, or filters (not both): filters cancel "
        "every matching unfinished job. --workflow ID alone cancels every unfinished member of that "
        "workflow and counts them per outcome.",
    )

JOBS = Command(
        "jobs", cmd_jobs, "list jobs, newest first",
        (
            *FILTER_ARGS,
            arg("--limit", type=int_arg(1, 100_000), default=DEFAULT_JOBS_LIMIT, metavar="N",
                help=f"at most N jobs (default {DEFAULT_JOBS_LIMIT})"),
            JSON_ARG,
        ),
    )

JOB = Command(
        "job", cmd_job, "show one job: its row, events timeline, attempts, parents and children",
        (arg("job_id", type=job_id_arg, metavar="ID"), JSON_ARG),
    )
