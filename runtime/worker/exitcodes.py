"""Worker process exit codes: a documented contract the supervisor and systemd rely on."""

from __future__ import annotations

OK = 0
"""Stopped cleanly: every held job finished or was released."""
ERROR = 1
"""An unexpected error inside the worker (it is logged)."""
USAGE = 2
"""Invalid settings or command line."""
DATABASE_UNAVAILABLE = 3
"""PostgreSQL unreachable or credentials refused at boot."""
SCHEMA = 5
"""Schema missing or too new: run `taskq migrate` / upgrade taskq."""
EMBEDDED_UNAVAILABLE = 6
"""No DSN and the embedded server is not installed or cannot start."""
IMPORT_ERROR = 10
"""APP could not be imported or is not a list/registry of actors. Restarting will not help."""
LEASES_LOST = 12
"""The heartbeat could not renew for lock_timeout while holding jobs: actors stopped at the lease deadline,
nothing written, leases left to the sweeper. (A worker holding no job waits for the database instead.)
Also a stop that could not release its jobs because the database did not answer: they are left to the
sweeper the same way."""
WATCHDOG = 13
"""The shutdown watchdog fired: the worker did not exit within shutdown_timeout (held jobs are recovered
later by lock expiry, as crash reclaims)."""
LEAKED_THREADS = 14
"""More actor threads leaked than max_leaked_threads: the worker restarted itself to reclaim them."""
