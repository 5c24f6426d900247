"""Actor declaration and the executors that run them."""

from __future__ import annotations

from taskq.actors.declaration import (
    Actor,
    ActorRegistry,
    Isolation,
    RetryKind,
    RetryPolicy,
    actor,
    as_registry,
    default_registry,
    default_retry_kind,
)

__all__ = [
    "Actor",
    "ActorRegistry",
    "Isolation",
    "RetryKind",
    "RetryPolicy",
    "actor",
    "as_registry",
    "default_registry",
    "default_retry_kind",
]
