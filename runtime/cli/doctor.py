"""`taskq doctor`: the health of the queue's database, as checks with a status (the CLI face of
taskq.ops.doctor; docs/doctor.md).

Exit codes (taskq.exitcodes): 0 no check critical (warnings allowed, unless --strict), 16 some check critical
(with --strict: or warning), 3 the database cannot be reached, 5 it has no taskq schema (`taskq migrate`).
Registered in `taskq.cli.COMMANDS`; built from `taskq.cli._base`.
"""

from __future__ import annotations

import argparse
import asyncio

from taskq.backend import transaction_pooler_from_env
from taskq.cli import output as cli_output
from taskq.cli._base import JSON_ARG, Command, arg, dsn_of, emit
from taskq.dsn import redact_dsn
from taskq.exitcodes import ExitCode
from taskq.ops.doctor import Check, Status, diagnose, worst

COLUMNS = ("check", "status", "value")


def report_text(checks: list[Check]) -> str:
    """The table, then what to do for each check that is not ok."""
    text = cli_output.table(COLUMNS, [(c.name, c.status.value, cli_output.printable(c.value)) for c in checks])
    todo = [c for c in checks if c.status is not Status.OK]
    if not todo:
        return text + f"\n\nall {len(checks)} checks ok"
    lines = [f"- {c.name} ({c.status.value}): {cli_output.printable(c.action)}" for c in todo]
    return text + "\n\nwhat to do\n" + "\n".join(lines)


def report_json(dsn: str, checks: list[Check]) -> str:
    return cli_output.to_json({
        "database": redact_dsn(dsn),
        "status": worst(checks).value,
        "checks": [{"name": c.name, "status": c.status.value, "value": c.value, "action": c.action or None,
                    "detail": c.detail} for c in checks],
    })


def exit_code(checks: list[Check], *, strict: bool) -> int:
    status = worst(checks)
    if status is Status.CRITICAL or (strict and status is Status.WARN):
        return ExitCode.UNHEALTHY
    return ExitCode.OK


def cmd_doctor(args: argparse.Namespace) -> int:
    dsn = dsn_of(args)
    pooler = args.transaction_pooler or transaction_pooler_from_env()
    checks = asyncio.run(diagnose(dsn, transaction_pooler=pooler))
    emit(report_json(dsn, checks) if args.json else report_text(checks))
    return exit_code(checks, strict=args.strict)


DOCTOR = Command(
    "doctor", cmd_doctor,
    "check the database for what hurts a queue: long transactions, the xmin horizon, slots, dead rows, "
    "wraparound, listening workers, a pooler, the schema, clock skew",
    (arg("--transaction-pooler", action="store_true",
         help="the DSN goes through a transaction pooler as configured (default: env TASKQ_TRANSACTION_POOLER)"),
     arg("--strict", action="store_true", help="exit 16 on a warning too, not only on a critical check"),
     JSON_ARG),
    description="Each check has a status (ok, warn, critical), the value measured and what to do (docs/doctor.md). "
    "Read-only; a monitoring role sees everything once granted pg_monitor. Exit codes: 0 nothing critical, "
    "16 a check is critical (--strict: or warns), 3 database unreachable, 5 no taskq schema (run `taskq migrate`).",
)
