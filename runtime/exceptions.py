"""The taskq error tree: one root, specific subclasses, each saying when it is raised.

Every exception class of the package lives here and derives from TaskqError, but for three, none an
error of taskq's making (listed in tests/unit/test_exitcodes_and_exceptions.py): `Snooze` (here, outside
the tree: an actor's request to run again, which `except TaskqError` must not swallow),
`taskq.actors.thread.ActorInterrupted` (a forced cancel: a BaseException so that an actor's
`except Exception` cannot swallow it either) and `taskq.web.problems.Problem` (an HTTP answer of the
optional web integration, raised and rendered inside its app, never seen by a caller of taskq).
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from taskq.exitcodes import ExitCode

if TYPE_CHECKING:
    from taskq.models import JobRow


class TaskqError(Exception):
    """Root of every error taskq raises on purpose."""


class ConfigurationError(TaskqError, ValueError):
    """A setting, DSN or option is invalid; raised before anything is written."""


class EmbeddedUnavailable(ConfigurationError):
    """No DSN was given and the embedded PostgreSQL extra is not installed or cannot start."""


class DatabaseUnavailable(TaskqError, ConnectionError):
    """PostgreSQL could not be reached or refused the credentials. The DSN's password is never included."""


class StatementTimeout(DatabaseUnavailable):
    """A statement ran past the statement timeout of its connection pool (the web server's) and PostgreSQL
    cancelled it: the server is reachable but too slow for now."""


class ConnectionUnusable(ConfigurationError):
    """The connection given as `enqueue(..., connection=)` cannot take the job: not a connection of the
    client's kind (sync for SyncJobsClient, async for JobsClient), closed, in a failed transaction, or to
    another database than the client's. Raised before any statement: the caller's transaction is as it was."""


class SchemaNotReady(TaskqError):
    """The database has no taskq schema, or misses migrations this code needs: run `taskq migrate`."""


class SchemaTooNew(TaskqError):
    """The database was migrated by a newer taskq than this one; upgrade taskq before using it."""


class MigrationError(TaskqError):
    """A migration failed; its transaction was rolled back and nothing of it is applied."""


class ActorDefinitionError(TaskqError, TypeError):
    """An `@actor` declaration is invalid (bad isolation, unpicklable process actor, duplicate name...)."""


class PayloadInvalid(TaskqError, ValueError):
    """A payload does not validate against the actor's payload type; nothing was written."""


class PayloadTooLarge(PayloadInvalid):
    """A payload's JSON encoding exceeds the client's `max_payload_bytes`; nothing was written."""


class UniqueKeyContention(TaskqError):
    """A unique enqueue found its key taken, but the holder kept ending before it could be read, several
    times in a row. Nothing was written; the call can simply be made again."""


class ResultInvalid(TaskqError, ValueError):
    """An actor returned a value that does not validate against, or serialise as, its result type."""


class NonRetryableError(TaskqError):
    """Raise (or subclass) from an actor to fail the job at once, whatever retry budget is left."""


class SnoozeInvalid(NonRetryableError, ValueError):
    """`taskq.Snooze(delay)` got a delay that is not a finite number of seconds between 0 and
    MAX_SNOOZE_SECONDS. Raised by the constructor inside the actor, so the attempt fails at once
    (error_class SnoozeInvalid, not retried: the same code would compute the same delay again)."""


MAX_SNOOZE_SECONDS = 10 * 366 * 86400.0
"""The longest snooze: ten years."""


class Snooze(Exception):
    """Raise from an actor to run the job again `delay` seconds from now (a float or a timedelta).

    The job goes back to `scheduled`, neither failed nor succeeded: a snooze never uses up max_attempts
    (each one gives its attempt back to the budget) while `attempt` and `claim_epoch` still rise at the
    next claim. Recorded as a `snoozed` event with the delay and a `snoozed` attempts row. An operator's
    cancel request on the row wins: the job ends cancelled instead. Works the same from async, thread and
    process actors."""

    def __init__(self, delay: float | timedelta) -> None:
        seconds = snooze_seconds(delay)
        super().__init__(seconds)
        self.delay = seconds

    def __str__(self) -> str:
        return f"snoozed for {self.delay:g} s"

    def __reduce__(self) -> tuple[Any, ...]:  # crosses the process-isolation boundary by pickle
        return (Snooze, (self.delay,))


def snooze_seconds(delay: Any) -> float:
    """The delay of a Snooze in seconds; SnoozeInvalid unless it is a finite number in [0, 10 years]."""
    return duration_seconds(delay, "Snooze delay", SnoozeInvalid)


def duration_seconds(value: Any, what: str, error: type[Exception]) -> float:
    """`value` (seconds, or a timedelta) in seconds: `error` unless it is a finite number in [0, 10 years]
    (a Snooze's delay; a durable sleep, a signal's timeout: taskq.context)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise error(f"{what} must be seconds (a number) or a timedelta, got {value!r}")
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_SNOOZE_SECONDS:
        raise error(f"{what} must be a finite number of seconds between 0 and ten years "
                    f"({MAX_SNOOZE_SECONDS:g}), got {value!r}")
    return seconds


class LeaseLost(TaskqError):
    """The attempt no longer holds its job (its lease ran out and another attempt took the job over, or the
    job was cancelled and forced): a step it tried to store, or the transaction of `ctx.transaction()`, was
    refused and nothing of it was written. Raised inside the actor, which should stop: nothing more it
    writes through the job can land."""


class StepInvalid(NonRetryableError, ValueError):
    """`ctx.step()` misused: a name that is empty, over 200 characters or with control characters, a name
    used twice in one run, a function that is not callable, or a result that cannot be stored as JSON
    (nothing was stored). The job fails at once: the same code would do the same again."""


class SleepInvalid(NonRetryableError, ValueError):
    """`ctx.sleep()` / `ctx.sleep_until()` / the timeout of `ctx.wait_for_signal()`: not a duration or a
    time, negative, NaN, or more than ten years away. The job fails at once."""


class SignalInvalid(ConfigurationError):
    """A signal's name (empty, over 200 characters, control characters) or payload (not JSON, over 1 MiB)
    is refused; nothing was stored."""


class SignalRefused(TaskqError):
    """A signal to a job that has ended (`status`): nothing was stored. (An unknown job: JobNotFound.)"""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status


class JobNotFound(TaskqError, KeyError):
    """No job has this id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such job"


class WorkflowNotFound(TaskqError, KeyError):
    """No job carries this workflow id (`cancel_workflow` of an id no `client.workflow()` wrote, or whose
    jobs retention has deleted); nothing was changed."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such workflow"


class SignalTimeout(TaskqError):
    """`ctx.wait_for_signal(name, timeout=...)`: the timeout passed with no signal of that name. Raised in the
    run after the timeout, and in every later run of the job at the same wait."""


class TransactionInvalid(NonRetryableError, RuntimeError):
    """`ctx.transaction()` misused: nested, used after the actor returned, or from a thread or process
    actor (it is for async actors, whose connection lives in the worker)."""


class JobFailed(TaskqError):
    """`JobHandle.wait()` saw the job end cancelled, failed, crashed or abandoned; `.row` is the final row."""

    def __init__(self, row: JobRow) -> None:
        self.row = row
        detail = f": {row.error_class}" if row.error_class else ""
        super().__init__(f"job {row.id} ended {row.status}{detail}")


class ScheduleDefinitionError(ConfigurationError):
    """A `Schedule` declaration is invalid: a bad cron expression or time zone, `every` not a positive
    whole number of seconds, both or neither of cron/every, a payload the actor's type refuses. Raised
    at construction, before anything is stored."""


class ScheduleNotFound(TaskqError, KeyError):
    """No schedule has that name (pause, resume or trigger of a name the database does not know)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "schedule not found"


class TokenNotFound(TaskqError, KeyError):
    """No API token has that name (`taskq tokens revoke` of a name the database does not know)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "token not found"


class TokenExists(TaskqError):
    """`taskq tokens create NAME` of a name already taken (revoked tokens keep their name)."""


class TokenRevoked(TaskqError):
    """The token a web request came with was revoked between its check and the audit row of its write
    (the database's audit function writes rows only for live tokens): the write rolled back."""


class DependencyInvalid(ConfigurationError):
    """`depends_on` or `dependency_mode` is invalid: an unknown mode, more parents than the limit
    (taskq.workflows.MAX_PARENTS), a parent that is a later job of the same graph (a cycle), or a parent
    that does not exist. Raised at enqueue; nothing was written."""


class DependencyNotFound(DependencyInvalid, KeyError):
    """A job named in `depends_on` does not exist (`missing` lists them); nothing was written."""

    def __init__(self, message: str, missing: tuple[object, ...] = ()) -> None:
        super().__init__(message)
        self.missing = missing

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class QueueNotFound(TaskqError, KeyError):
    """No queue has that name: it has no taskq.queues row (no worker served it, no operator set it) and
    no unfinished job names it (pause or resume of a name the database does not know)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "queue not found"


class ChildProcessDied(TaskqError):
    """Raised by ProcessExecutor.run when the child running the attempt exited without reporting an
    outcome and the worker had not stopped it (a segfault, `os._exit`, the OOM killer). The message names
    the exit code or signal. The attempt fails through the actor's retry policy."""


class StandInError(TaskqError):
    """Stands in for an actor's exception that cannot travel as itself: a BaseException such as
    SystemExit raised by a thread or process actor (it would stop the worker itself), or an exception a
    child process could not pickle. Subclasses are made per original class name
    (`taskq.actors.thread.stand_in_error`), so the job's error_class reads the same; `remote_traceback`
    is the traceback where it was raised, when known."""

    remote_traceback: str = ""


class BenchFailed(TaskqError):
    """Raised by `taskq bench` (taskq.ops.bench) when a run cannot give its figures: a worker process it
    started exited, jobs stopped moving for a minute, or drain jobs did not succeed. The run's rows are
    deleted all the same."""


class CliError(TaskqError):
    """A failure a `taskq` command reports to the user as one line, exiting with `code`."""

    code = ExitCode.INTERNAL


class UsageError(CliError):
    """Raised by a `taskq` command whose command line is wrong (arguments, JSON, filters, ids, option
    values). Exit code 2."""

    code = ExitCode.USAGE


class NotFound(CliError):
    """Raised by a `taskq` command when the job it names does not exist. Exit code 4."""

    code = ExitCode.NOT_FOUND


class MissingExtra(CliError):
    """Raised by a `taskq` command that needs an optional extra which is not installed (`taskq web`
    without `taskq[web]`). Exit code 8."""

    code = ExitCode.MISSING_EXTRA


class AppNotImportable(CliError):
    """APP (`module:attribute`) cannot be imported or names no actors; restarting will not help. Raised
    by `taskq.worker.cli.load_app`, so by `taskq worker`, `taskq run` (with the preload, or in a worker
    forked with --no-preload). Exit code 10 for the command, the worker and the supervisor alike."""

    code = ExitCode.IMPORT_ERROR
