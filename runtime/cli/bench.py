"""`taskq bench`: the enqueue, drain and pickup figures of this machine against the database in use, as one
table (the CLI face of taskq.ops.bench; docs/bench.md).

The run writes only to a queue of its own and deletes every row it wrote before it exits, also after an
error, Ctrl-C or SIGTERM. Exit codes (taskq.exitcodes): 0 the figures, 2 a bad option (nothing written) or a
role that may not delete what a run writes, 3 the database cannot be reached, 5 the schema is not migrated
(`taskq migrate`; the bench never migrates), 1 a run that could not finish (a worker exited, jobs stopped
moving), 130 interrupted. On a terminal each step is announced on stderr; piped, or with --json, only the
result is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import sys
from typing import TextIO

from taskq.cli import output
from taskq.cli._base import JSON_ARG, Command, arg, dsn_of, emit
from taskq.cli.args import int_arg, seconds_up_to
from taskq.client import JobsClient
from taskq.dsn import redact_dsn
from taskq.exitcodes import ExitCode
from taskq.ops.bench import (
    BATCH,
    MAX_JOBS,
    MAX_SECONDS,
    MAX_WORKERS,
    PICKUP_RATE,
    BenchPlan,
    BenchReport,
    Figure,
    actors,
    run_bench,
)

COLUMNS = ("metric", "value", "unit")
DEFAULTS = BenchPlan()


def figure_text(figure: Figure) -> str:
    if math.isnan(figure.value):
        return output.NONE
    return f"{figure.value:,.0f}" if figure.unit == "jobs/s" else f"{figure.value:,.2f}"


def report_text(report: BenchReport) -> str:
    m, plan = report.machine, report.plan
    workers = f"{plan.workers} worker process{'es' if plan.workers > 1 else ''}"
    d = report.deleted
    lines = [
        f"taskq bench: {m.cpus or '?'} CPUs, PostgreSQL {m.postgresql}, synchronous_commit {m.synchronous_commit}",
        output.table(COLUMNS, [(f.metric, figure_text(f), f.unit) for f in report.figures]),
        "",
        f"enqueue: client.enqueue, one job per call, for {plan.seconds:g} s; enqueue_many: {BATCH} jobs per call, "
        f"for {plan.seconds:g} s",
        f"drain: {report.drained:,} no-op jobs, {workers} with the default settings, first start to last finish",
        f"pickup: {report.pickup_jobs:,} jobs at {PICKUP_RATE:g}/s, one per call, to the same {workers} (idle), "
        "created_at to started_at (the server's clock)",
        f"cleaned up queue {report.queue}: {d.jobs:,} jobs, {d.events:,} events, {d.attempts:,} attempts, "
        f"{d.workers:,} worker rows, {d.other:,} other rows; {report.elapsed:.1f} s in all",
    ]
    return "\n".join(lines)


def report_json(dsn: str, report: BenchReport) -> str:
    m, plan, d = report.machine, report.plan, report.deleted
    return output.to_json(
        {
            "database": redact_dsn(dsn),
            "queue": report.queue,
            "machine": {"cpus": m.cpus, "postgresql": m.postgresql, "synchronous_commit": m.synchronous_commit},
            "plan": {
                "jobs": plan.jobs,
                "workers": plan.workers,
                "seconds": plan.seconds,
                "batch": BATCH,
                "pickup_rate": PICKUP_RATE,
            },
            "metrics": [
                {"metric": f.metric, "value": None if math.isnan(f.value) else round(f.value, 3), "unit": f.unit}
                for f in report.figures
            ],
            "drained": report.drained,
            "pickup_jobs": report.pickup_jobs,
            "deleted": {
                "jobs": d.jobs,
                "events": d.events,
                "attempts": d.attempts,
                "workers": d.workers,
                "other": d.other,
            },
            "elapsed": round(report.elapsed, 3),
        }
    )


class PhaseLine:
    """`taskq bench: <step>...` on stderr, one line per step."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __call__(self, text: str) -> None:
        self.stream.write(f"taskq bench: {text}...\n")
        self.stream.flush()


def cmd_bench(args: argparse.Namespace) -> int:
    plan = BenchPlan(jobs=args.jobs, workers=args.workers, seconds=args.seconds)
    dsn = dsn_of(args)
    progress = None if args.json or not sys.stderr.isatty() else PhaseLine(sys.stderr)

    async def go() -> BenchReport:
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            # as Ctrl-C does: the task is cancelled and the run cleans up on its way out; once only, so that a
            # second SIGTERM cannot cut the clean-up short
            if not task.cancelling():
                task.cancel("SIGTERM")

        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        async with await JobsClient.connect(dsn, registry=actors, min_size=1, max_size=4) as client:
            return await run_bench(client, plan, on_phase=progress)

    try:
        report = asyncio.run(go())
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
    emit(report_json(dsn, report) if args.json else report_text(report))
    return ExitCode.OK


BENCH = Command(
    "bench",
    cmd_bench,
    "measure this machine against the database: enqueue and enqueue_many jobs/s, the drain of a backlog by "
    "worker processes, enqueue-to-start latency; writes only a queue of its own and deletes it",
    (
        arg(
            "--jobs",
            type=int_arg(1, MAX_JOBS),
            default=DEFAULTS.jobs,
            metavar="N",
            help=f"no-op jobs the workers drain (default {DEFAULTS.jobs:,}, at most {MAX_JOBS:,})",
        ),
        arg(
            "--workers",
            type=int_arg(1, MAX_WORKERS),
            default=DEFAULTS.workers,
            metavar="N",
            help=f"worker processes that drain them, default settings (default {DEFAULTS.workers}, at most "
            f"{MAX_WORKERS})",
        ),
        arg(
            "--seconds",
            type=seconds_up_to(MAX_SECONDS),
            default=DEFAULTS.seconds,
            metavar="S",
            help=f"length of each enqueue figure and of the pickup figure (default {DEFAULTS.seconds:g}, at most "
            f"{MAX_SECONDS:g})",
        ),
        JSON_ARG,
    ),
    description="Prints one table (metric, value, unit) after a header with the CPUs, the PostgreSQL version and "
    "synchronous_commit: enqueue (client.enqueue, one job per call) and enqueue_many (batches of 100) jobs/s; "
    "drain jobs/s (--jobs no-op jobs, --workers worker processes with the default settings, from the rows); "
    "pickup p50 and p99 ms (jobs at 50/s to the idle workers, created_at to started_at). It writes only to a "
    "queue of its own (taskq-bench-<hex>) and deletes every row it wrote before it exits, also after an error or "
    "Ctrl-C; it needs a migrated schema and a role that may delete (the owner's). Under a minute with the "
    "defaults (docs/bench.md). Exit codes: 0 ok, 1 the run could not finish, 2 usage, 3 database unreachable, "
    "5 schema not migrated.",
)
