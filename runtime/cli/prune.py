"""`taskq prune [--dry-run] [--json]`: delete the terminal jobs (with their events) and the attempts rows
past their retention windows now, as every worker does every `prune_interval`.

The windows are the WorkerSettings fields `retention_succeeded`, `retention_failed`,
`retention_attempts`, `retention_receipts` and `retention_audit`, from the flags of the same names, else
env TASKQ_RETENTION_*, else the defaults; a negative or NaN window is a usage error (exit 2) and nothing
is deleted. On a terminal a progress line (rows so far, rate) is redrawn on stderr; piped, or with
--json, the command prints only its result.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING, TextIO

from taskq.cli import output
from taskq.cli._base import JSON_ARG, Command, arg, dsn_of, settings_args, worker_settings
from taskq.models import PruneResult
from taskq.ops.retention import keep_windows, prune

if TYPE_CHECKING:
    from taskq.settings import WorkerSettings

RETENTION_FIELDS = ("retention_succeeded", "retention_failed", "retention_attempts", "retention_receipts",
                    "retention_audit")

HELP = "delete terminal jobs, attempts rows, web receipts and audit rows past their retention windows"
DESCRIPTION = (
    "Delete succeeded and cancelled jobs older than --retention-succeeded seconds (default 1 day), failed, "
    "crashed and abandoned jobs older than --retention-failed (default 7 days), each with its events, and "
    "job_attempts rows older than --retention-attempts (default 30 days), the web API's idempotency receipts "
    "older than --retention-receipts (default 1 day) and its audit rows older than --retention-audit (default "
    "90 days, at least 1 hour); 0 keeps a class forever. Workers "
    "do the same every prune_interval. --dry-run counts and deletes nothing."
)


class ProgressLine:
    """`pruned N rows (R rows/s)` redrawn in place on a terminal; nothing at all otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.shown = False

    def __call__(self, rows: int, elapsed: float) -> None:
        rate = rows / elapsed if elapsed > 0 else 0.0
        self.stream.write(f"\rpruned {rows:,} rows ({rate:,.0f} rows/s)\x1b[K")
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def summary(result: PruneResult) -> str:
    verb = "would delete" if result.dry_run else "deleted"
    lines = [
        f"succeeded+cancelled jobs         {result.succeeded}",
        f"failed+crashed+abandoned jobs    {result.failed}",
        f"job_attempts rows                {result.attempts}",
        f"idempotency receipts             {result.receipts}",
        f"operator audit rows              {result.audit}",
        f"job_events rows (with the jobs)  {result.events}",
    ]
    tail = "dry run: nothing deleted" if result.dry_run else f"in {result.seconds:.2f}s"
    return f"{verb}:\n" + "\n".join("  " + line for line in lines) + f"\n{tail}"


def run_prune(args: argparse.Namespace, settings: WorkerSettings, dsn: str) -> int:
    """The body of `taskq prune`, given the checked settings and the DSN."""
    progress = None if args.json or args.dry_run or not sys.stderr.isatty() else ProgressLine(sys.stderr)

    async def go() -> PruneResult:
        from taskq.backend import Backend

        backend = await Backend.open(dsn, min_size=1, max_size=1)
        try:
            return await prune(backend, keep_windows(settings), dry_run=args.dry_run, on_progress=progress)
        finally:
            if progress is not None:
                progress.close()
            await backend.close()

    result = asyncio.run(go())
    print(output.to_json(result) if args.json else summary(result), flush=True)
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    return run_prune(args, worker_settings(args), dsn_of(args))


def commands() -> tuple[Command, ...]:
    """`taskq prune`, with the retention windows' settings flags."""
    retention = tuple(a for a in settings_args() if a.options["dest"].removeprefix("setting_") in RETENTION_FIELDS)
    return (
        Command(
            "prune", cmd_prune, HELP,
            (arg("--dry-run", action="store_true", help="count what would be deleted; delete nothing"),
             *retention, JSON_ARG),
            description=DESCRIPTION,
        ),
    )
