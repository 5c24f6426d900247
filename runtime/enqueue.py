"""Payloads and enqueue options, checked and encoded before anything reaches the database: one place shared
by the clients, the CLI, the web API, the worker's `ctx.jobs.enqueue` and schedule declarations."""

from __future__ import annotations

import math
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from pydantic import ConfigDict, TypeAdapter
from pydantic_core import SchemaValidator, core_schema, from_json

from taskq.actors.declaration import Actor, ActorRegistry
from taskq.backend import JobInsert, JobOptions, uuid7
from taskq.checks import as_workflow_id, check_fairness_key, check_text
from taskq.exceptions import ConfigurationError, PayloadInvalid, PayloadTooLarge
from taskq.unique import unique_of

DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_ATTEMPTS = 1_000_000
"""The most attempts a job may be given (as for a requeue's `attempts`)."""
_ANY: TypeAdapter[Any] = TypeAdapter(Any, config=ConfigDict(ser_json_inf_nan="constants"))
# `\u0000` in JSON text is a NUL only when the backslash before it is not itself escaped (`\\u0000`
# is the text "\u0000"): an odd number of backslashes in a row.
_JSON_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")


def _seconds(name: str, value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigurationError(f"{name} must be a positive finite duration, got {value!r}")
    return float(seconds)


def _when(value: datetime | timedelta | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return datetime.now(UTC) + value
    if not isinstance(value, datetime):
        raise ConfigurationError(f"scheduled_at must be a datetime or timedelta, got {value!r}")
    if value.tzinfo is None:
        raise ConfigurationError("scheduled_at must be timezone-aware (e.g. datetime.now(UTC))")
    return value


def encode_payload(actor: Actor[Any, Any] | None, name: str, payload: Any, max_bytes: int) -> str:
    """Validate (when the actor is known here) and encode the payload as JSON text, within the size limit."""
    if actor is not None:
        raw = actor.dump_payload(payload)
    else:
        try:
            raw = _ANY.dump_json(payload)
        except Exception as exc:
            raise PayloadInvalid(f"payload for actor {name!r} cannot be encoded as JSON: {exc}") from None
        # _ANY writes NaN/Infinity as bare tokens rather than a silent null: refuse them (they may also
        # be text inside a string, hence the strict parse to tell)
        if (b"NaN" in raw or b"Infinity" in raw) and not _finite_json(raw):
            raise PayloadInvalid(
                f"payload for actor {name!r} contains NaN or Infinity, which JSON cannot represent"
            )
    return _checked_json(raw, name, max_bytes)


def _finite_json(raw: bytes) -> bool:
    try:
        from_json(raw, allow_inf_nan=False)
    except ValueError:
        return False
    return True


def _checked_json(raw: bytes, name: str, max_bytes: int) -> str:
    if len(raw) > max_bytes:
        raise PayloadTooLarge(
            f"payload for actor {name!r} is {len(raw):,} bytes of JSON, over the limit of {max_bytes:,} "
            "(store large data elsewhere and enqueue a reference, or raise max_payload_bytes)"
        )
    if b"\\u0000" in raw and _JSON_NUL_ESCAPE.search(raw):
        raise PayloadInvalid(
            f"payload for actor {name!r} contains a NUL character, which PostgreSQL cannot store"
        )
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadInvalid(f"payload for actor {name!r} is not valid UTF-8") from None


_LIST_VALIDATORS: weakref.WeakKeyDictionary[Actor[Any, Any], SchemaValidator | None] = weakref.WeakKeyDictionary()


def _list_validator(actor: Actor[Any, Any]) -> SchemaValidator | None:
    """Validates a list of the actor's payloads in one call (None if its schema cannot be wrapped)."""
    try:
        return _LIST_VALIDATORS[actor]
    except KeyError:
        pass
    try:
        validator: SchemaValidator | None = SchemaValidator(
            core_schema.list_schema(actor.payload_adapter.core_schema)
        )
    except Exception:
        validator = None
    _LIST_VALIDATORS[actor] = validator
    return validator


def encode_payloads(actor: Actor[Any, Any] | None, name: str, payloads: Sequence[Any], max_bytes: int) -> list[str]:
    """`encode_payload` for each payload. A known actor's payloads are validated in one pydantic call,
    which halves the per-payload cost of enqueue_many; any failure re-runs them one by one, so the
    error raised is exactly the one `enqueue` would raise for the first bad payload."""
    validator = _list_validator(actor) if actor is not None and len(payloads) > 1 else None
    if actor is not None and validator is not None:
        try:
            values = validator.validate_python(list(payloads))
            dump = actor.payload_adapter.dump_json
            return [_checked_json(dump(v), name, max_bytes) for v in values]
        except PayloadInvalid:
            raise
        except Exception:
            pass
    return [encode_payload(actor, name, p, max_bytes) for p in payloads]


def check_actor_queue(actor: Actor[Any, Any], queue: str) -> None:
    """ConfigurationError when the actor is not bound to this queue (a worker would refuse to run it)."""
    if not actor.allows_queue(queue):
        raise ConfigurationError(
            f"actor {actor.name!r} may not run on queue {queue!r}: it runs on {list(actor.queues)!r} only; "
            f"enqueue it there, or allow the queue with @actor(queues=[...]) (e.g. queues=[{actor.queue!r}, "
            f"{queue!r}])"
        )


def check_options(
    target: Actor[Any, Any] | str,
    registry: ActorRegistry,
    *,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] = (),
    scheduled_at: datetime | timedelta | None = None,
    max_attempts: int | None = None,
    schedule_to_close: float | timedelta | None = None,
    concurrency_key: str | None = None,
    fairness_key: str | None = None,
) -> tuple[Actor[Any, Any] | None, JobOptions]:
    """The actor (when this process knows it) and the checked options, shared by every payload. A known
    actor is refused on a queue it is not bound to (`@actor(queues=...)`); a name this process does not
    know is taken as given, and the worker that claims the job checks its queue."""
    if isinstance(target, Actor):
        actor: Actor[Any, Any] | None = target
        name = target.name
    elif isinstance(target, str):
        name = check_text("actor name", target)
        actor = registry.get(name)
    else:
        raise ConfigurationError(f"enqueue needs an actor or an actor name, got {target!r}")
    if isinstance(tags, str):
        raise ConfigurationError("tags must be a sequence of strings, not one string")
    tag_tuple = tuple(check_text("tag", t) for t in tags)
    attempts = max_attempts if max_attempts is not None else (actor.max_attempts if actor else 3)
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= MAX_ATTEMPTS:
        raise ConfigurationError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS:,}, got {attempts!r}")
    prio = priority if priority is not None else (actor.priority if actor else 0)
    if isinstance(prio, bool) or not isinstance(prio, int) or not -(2**31) <= prio < 2**31:
        raise ConfigurationError(f"priority must be a 32-bit int, got {prio!r}")
    deadline = schedule_to_close if schedule_to_close is not None else (actor.schedule_to_close if actor else None)
    chosen = check_text("queue", queue if queue is not None else (actor.queue if actor else "default"))
    if actor is not None:
        check_actor_queue(actor, chosen)
    return actor, JobOptions(
        actor=name,
        queue=chosen,
        priority=prio,
        tags=tag_tuple,
        max_attempts=attempts,
        scheduled_at=_when(scheduled_at),
        schedule_to_close=_seconds("schedule_to_close", deadline),
        idempotent=actor.idempotent if actor is not None else True,
        concurrency_key=None if concurrency_key is None else check_text("concurrency_key", concurrency_key),
        fairness_key=check_fairness_key(fairness_key),
    )


def prepare_insert(
    target: Actor[Any, Any] | str,
    payload: Any,
    *,
    registry: ActorRegistry,
    max_payload_bytes: int,
    queue: str | None = None,
    priority: int | None = None,
    tags: Iterable[str] = (),
    scheduled_at: datetime | timedelta | None = None,
    max_attempts: int | None = None,
    schedule_to_close: float | timedelta | None = None,
    parent_id: UUID | None = None,
    unique_key: str | bool | None = None,
    unique_scope: str = "active",
    concurrency_key: str | None = None,
    fairness_key: str | None = None,
    workflow_id: UUID | str | None = None,
) -> JobInsert:
    """Everything enqueue checks before any write: the payload, names, tags, times, limits and key.
    `workflow_id`: the workflow the job joins (cancel_workflow, the dashboard's workflow page)."""
    actor, opts = check_options(
        target, registry, queue=queue, priority=priority, tags=tags, scheduled_at=scheduled_at,
        max_attempts=max_attempts, schedule_to_close=schedule_to_close, concurrency_key=concurrency_key,
        fairness_key=fairness_key,
    )
    if parent_id is not None:
        opts = replace(opts, parent_id=parent_id)
    if workflow_id is not None:
        opts = replace(opts, workflow_id=as_workflow_id(workflow_id))
    payload_json = encode_payload(actor, opts.actor, payload, max_payload_bytes)
    if unique_key is None and unique_scope == "active":
        return JobInsert(id=uuid7(), payload_json=payload_json, options=opts)
    key, scope = unique_of(unique_key, unique_scope, opts.actor, opts.queue, payload_json)
    return JobInsert(id=uuid7(), payload_json=payload_json, options=opts, unique_key=key, unique_scope=scope)




def batch_fairness_keys(
    fairness_key: str | Sequence[str | None] | None, opts: JobOptions, count: int, *, dependent: bool
) -> tuple[JobOptions, list[str | None] | None]:
    """`enqueue_many`'s fairness keys: one key for every job (in the options), or one key (or None) per
    payload (returned as a list, the options keeping None)."""
    if fairness_key is None or isinstance(fairness_key, str):
        return replace(opts, fairness_key=check_fairness_key(fairness_key)), None
    if isinstance(fairness_key, bytes) or not isinstance(fairness_key, Sequence):
        raise ConfigurationError(
            f"fairness_key must be a string, or a sequence with one key (or None) per payload, got {fairness_key!r}"
        )
    if len(fairness_key) != count:
        raise ConfigurationError(
            f"fairness_key: {len(fairness_key)} keys for {count} payloads (give one key, or None, per payload)"
        )
    if dependent:
        raise ConfigurationError("fairness_key: one key per payload cannot be combined with depends_on (give one key)")
    return opts, [check_fairness_key(k) for k in fairness_key]
