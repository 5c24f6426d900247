"""`taskq migrate` and `taskq dsn`."""

from __future__ import annotations

import argparse
import asyncio

from taskq.backend.migrations import migrate_dsn, migration_names
from taskq.cli._base import Command, dsn_of, emit
from taskq.dsn import redact_dsn
from taskq.exitcodes import ExitCode


def cmd_dsn(args: argparse.Namespace) -> int:
    emit(redact_dsn(dsn_of(args)))
    return ExitCode.OK


def cmd_migrate(args: argparse.Namespace) -> int:
    outcome = asyncio.run(migrate_dsn(dsn_of(args)))
    names = migration_names()
    for version in outcome.applied:
        emit(f"applied {version:04d}_{names.get(version, '?')}")
    if outcome.applied:
        emit(f"schema is now at version {outcome.current}")
    else:
        emit(f"schema is up to date (version {outcome.current}); nothing to apply")
    return ExitCode.OK


MIGRATE = Command("migrate", cmd_migrate, "create or upgrade the taskq schema (safe to run again)")

DSN = Command("dsn", cmd_dsn, "print the database in use, without its password")
