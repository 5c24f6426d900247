"""The taskq error tree: one root, specific subclasses, each saying when it is raised."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
