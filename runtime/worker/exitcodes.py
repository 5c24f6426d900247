"""The worker's names for its exit codes, kept because tests and scripts import them: each is a member
of `taskq.exitcodes.ExitCode`, where every code is documented. New code uses ExitCode."""

from __future__ import annotations

from taskq.exitcodes import ExitCode

OK = ExitCode.OK
ERROR = ExitCode.INTERNAL
USAGE = ExitCode.USAGE
DATABASE_UNAVAILABLE = ExitCode.DATABASE_UNAVAILABLE
SCHEMA = ExitCode.SCHEMA
EMBEDDED_UNAVAILABLE = ExitCode.EMBEDDED_UNAVAILABLE
IMPORT_ERROR = ExitCode.IMPORT_ERROR
LEASES_LOST = ExitCode.LEASES_LOST
WATCHDOG = ExitCode.WATCHDOG
LEAKED_THREADS = ExitCode.LEAKED_THREADS
