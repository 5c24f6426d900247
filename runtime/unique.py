"""Unique (idempotent) enqueue: checking a given key and scope, and deriving a key from a payload.

The database enforces the key (jobs_unique_key_idx, migration 0003); this module only decides which
key a job carries."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from pydantic_core import from_json

from taskq.backend import JobOptions
from taskq.checks import check_text
from taskq.exceptions import ConfigurationError
from taskq.models import UNIQUE_SCOPES


def check_unique_scope(unique_scope: str) -> str:
    if not isinstance(unique_scope, str) or unique_scope not in UNIQUE_SCOPES:
        raise ConfigurationError(f"unique_scope must be 'active' or 'retained', got {unique_scope!r}")
    return unique_scope


def check_unique_key(unique_key: object) -> str:
    """A given unique key: 1-255 characters of valid Unicode without NUL (bytes are refused: decode them)."""
    if isinstance(unique_key, bytes | bytearray):
        raise ConfigurationError("unique_key must be text (str), not bytes: decode it first")
    if not isinstance(unique_key, str):
        raise ConfigurationError(f"unique_key must be a string or True, got {unique_key!r}")
    return check_text("unique_key", unique_key)


def derive_unique_key(actor: str, queue: str, payload_json: str) -> str:
    """`unique_key=True`: a digest of the actor, the queue and the canonical JSON (sorted keys, no
    spaces) of the validated payload, so equal payloads give equal keys whatever their key order."""
    canonical = json.dumps(from_json(payload_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(json.dumps([actor, queue, canonical], ensure_ascii=False).encode()).hexdigest()
    return f"sha256:{digest}"


def unique_of(
    unique_key: str | bool | None, unique_scope: str, actor: str, queue: str, payload_json: str
) -> tuple[str | None, str | None]:
    """The (key, scope) to store for one job: (None, None) without a key."""
    scope = check_unique_scope(unique_scope)
    if unique_key is None:
        if scope != "active":
            raise ConfigurationError("unique_scope='retained' needs a unique_key")
        return None, None
    if unique_key is True:
        return derive_unique_key(actor, queue, payload_json), scope
    return check_unique_key(unique_key), scope


def batch_unique_keys(
    unique_key: str | bool | Sequence[str | None] | None, unique_scope: str, opts: JobOptions, encoded: list[str]
) -> list[str | None] | None:
    """One key (or None) per payload of an enqueue_many call; None when no payload has a key."""
    if check_unique_scope(unique_scope) != "active" and unique_key is None:
        raise ConfigurationError("unique_scope='retained' needs a unique_key")
    if unique_key is None:
        return None
    if unique_key is True:
        return [derive_unique_key(opts.actor, opts.queue, p) for p in encoded]
    if isinstance(unique_key, str | bytes | bytearray):
        key = check_unique_key(unique_key)
        return [key] * len(encoded)
    if not isinstance(unique_key, Sequence):
        raise ConfigurationError(f"unique_key must be a string, True or one key per payload, got {unique_key!r}")
    if len(unique_key) != len(encoded):
        raise ConfigurationError(
            f"unique_key has {len(unique_key)} keys for {len(encoded)} payloads: give one per payload (None for none)"
        )
    keys: list[str | None] = []
    given = False
    for k in unique_key:
        # the common case checked inline (a short ASCII str), saving a function call per key
        if type(k) is str and 0 < len(k) <= 255 and k.isascii() and "\x00" not in k:
            keys.append(k)
            given = True
        elif k is None:
            keys.append(None)
        else:
            keys.append(check_unique_key(k))
            given = True
    return keys if given else None


