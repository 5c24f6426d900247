"""Operator actions on queues: stats, pause, resume, limits, fairness weights. One function per action over a Backend,
called alike by JobsClient, SyncJobsClient (generated from this module), the CLI and (later) the web API;
each checks its input
before any database work, so a bad value changes nothing."""

from __future__ import annotations

import math
from typing import Any
from uuid import UUID

from taskq.backend import Backend
from taskq.backend import queues as queue_store
from taskq.backend.queues import AHEAD_CAP, UNSET, FairWaitState, LimitChange, WaitState
from taskq.checks import check_fairness_key, check_fairness_weight, check_reason, check_text
from taskq.exceptions import ConfigurationError, QueueNotFound
from taskq.models import FairKeyStats, FairnessWeightResult, QueueLimitsResult, QueuePauseResult, QueueStatsReport
from taskq.ops.schedules import operator_name

MAX_LIMIT = 2**31 - 1
MAX_PERIOD = 366 * 86400.0


def check_limit(name: str, value: Any, *, allow_none: bool = True) -> int | None:
    """A concurrency or rate limit: an int >= 1 (None removes it where allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        shown = str(value) if isinstance(value, float) and not math.isfinite(value) else repr(value)
        raise ConfigurationError(f"{name} must be a whole number between 1 and {MAX_LIMIT}, got {shown}")
    return value


def check_period(name: str, value: Any) -> float:
    """A rate period: a finite number of seconds > 0 (at most a year)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_PERIOD:
        shown = str(value) if isinstance(value, float) and not math.isfinite(value) else repr(value)
        raise ConfigurationError(f"{name} must be a finite number of seconds > 0 and at most a year, got {shown}")
    return float(value)


def check_queue_name(name: Any) -> str:
    return check_text("a queue name", name)


def check_by(by: Any) -> str:
    if by is None:
        return operator_name()
    return check_text("by", by)


async def queue_stats(backend: Backend) -> QueueStatsReport:
    """Every known queue with its counts, pause and limits, and the actor limits in force."""
    return await queue_store.queue_stats(backend)


async def pause_queue(backend: Backend, name: str, *, reason: str | None = None, by: str | None = None
                      ) -> QueuePauseResult:
    """Stop every worker of the fleet from claiming from the queue until it is resumed. Running jobs go
    on, enqueue still works, the pause is stored (it survives restarts). QueueNotFound for a name the
    database does not know."""
    return await _set_paused(backend, name, True, reason, by)


async def resume_queue(backend: Backend, name: str, *, reason: str | None = None, by: str | None = None
                       ) -> QueuePauseResult:
    """Let workers claim from the queue again (they hear of it at once by NOTIFY, or at their next poll)."""
    return await _set_paused(backend, name, False, reason, by)


async def _set_paused(backend: Backend, name: str, paused: bool, reason: str | None, by: str | None
                      ) -> QueuePauseResult:
    name = check_queue_name(name)
    reason = check_reason(reason)
    who = check_by(by)
    changed = await queue_store.queue_set_paused(backend, name, paused, by=who, reason=reason)
    if changed is None:
        raise not_found(name)
    return QueuePauseResult(name=name, paused=paused, changed=changed)


async def set_queue_limits(
    backend: Backend,
    name: str,
    *,
    concurrency: int | None = UNSET,
    concurrency_per_key: int | None = UNSET,
    rate_limit: int | None = UNSET,
    rate_period: float | None = UNSET,
    reason: str | None = None,
    by: str | None = None,
) -> QueueLimitsResult:
    """Set a queue's fleet-wide limits: at most `concurrency` jobs running across all workers, at most
    `concurrency_per_key` per concurrency key, at most `rate_limit` starts per `rate_period` seconds.
    A limit left out is kept; None removes it (rate_limit=None removes the rate and its period). Creates
    the queue's row if it has none."""
    name = check_queue_name(name)
    change: dict[str, Any] = {}
    if concurrency is not UNSET:
        change["concurrency"] = check_limit("concurrency", concurrency)
    if concurrency_per_key is not UNSET:
        change["concurrency_per_key"] = check_limit("concurrency_per_key", concurrency_per_key)
    if rate_limit is not UNSET or rate_period is not UNSET:
        if rate_limit is None:
            if rate_period not in (UNSET, None):
                raise ConfigurationError("rate_period without rate_limit: give both, or rate_limit=None to remove")
            change["rate_limit"] = change["rate_period"] = None
        else:
            if rate_limit is UNSET or rate_period is UNSET or rate_period is None:
                raise ConfigurationError("a rate limit needs both rate_limit and rate_period (seconds)")
            change["rate_limit"] = check_limit("rate_limit", rate_limit, allow_none=False)
            change["rate_period"] = check_period("rate_period", rate_period)
    if not change:
        raise ConfigurationError("set_queue_limits needs at least one limit to set or remove")
    reason = check_reason(reason)
    limits = await queue_store.queue_set_limits(backend, name, LimitChange(**change), by=check_by(by),
                                                   reason=reason)
    return QueueLimitsResult(name=name, limits=limits)


MAX_KEYS_SHOWN = 1000
"""`fair_keys` lists at most this many keys of a queue (those with the most ready jobs first)."""


def check_weight_key(key: Any) -> str:
    """The key of a weight: 1-200 characters without control characters, or '' (None) for jobs enqueued
    without a key."""
    return check_fairness_key(key, allow_empty=True) or ""


def not_found(name: str) -> QueueNotFound:
    return QueueNotFound(f"no queue named {name!r} (no worker serves it and no unfinished job names it)")


async def set_fairness_weight(backend: Backend, queue: str, key: str | None, weight: float, *,
                              by: str | None = None) -> FairnessWeightResult:
    """Give the key's jobs in the queue `weight` times the share of starts of a key of weight 1, among the
    keys with jobs ready at the same priority. Key '' (or None) is the jobs enqueued without a key; weight
    1 is the default (setting it removes the stored weight). The key's ready jobs are re-spaced at once,
    in the transaction of the change, and the queue becomes fair (jobs without a key are tagged there
    from now on). QueueNotFound for a name the database does not know, as for a pause."""
    queue = check_queue_name(queue)
    key = check_weight_key(key)
    weight = check_fairness_weight(weight)
    done = await queue_store.queue_set_fairness_weight(backend, queue, key, weight, by=check_by(by))
    if done is None:
        raise not_found(queue)
    previous, retagged = done
    return FairnessWeightResult(queue=queue, key=key, weight=weight, previous=previous, retagged=retagged)


async def fairness_weights(backend: Backend, queue: str) -> dict[str, float]:
    """The queue's weights other than the default 1, by key ('' = jobs without a key)."""
    return await queue_store.queue_fairness_weights(backend, check_queue_name(queue))


async def fair_keys(backend: Backend, queue: str, *, limit: int = MAX_KEYS_SHOWN) -> list[FairKeyStats]:
    """Per fairness key of the queue: ready, scheduled, running, started in the last minute, weight (the
    keys with the most ready jobs first, at most `limit`). QueueNotFound for an unknown queue."""
    queue = check_queue_name(queue)
    limit = check_limit("limit", limit) or MAX_KEYS_SHOWN
    if not await queue_store.queue_known(backend, queue):
        raise not_found(queue)
    return await queue_store.queue_fair_keys(backend, queue, limit=limit)


async def job_wait_reason(backend: Backend, job_id: UUID) -> str | None:
    """Why the job, due and waiting, has not started: its queue is paused, or a limit is used up
    ("waiting for a concurrency slot of queue mail (5/5 in use)"), its actor's isolation class has no
    free slot on any worker, its key's share is used. Every reason that holds, joined by '; '; None when
    nothing holds it."""
    state = await queue_store.job_wait_state(backend, job_id)
    if state is None:
        return None
    fair = await queue_store.job_fair_wait_state(backend, job_id)
    reasons = [describe_wait(state), *(describe_fair_wait(fair) if fair is not None else [])]
    return "; ".join([r for r in reasons if r]) or None


def describe_fair_wait(state: FairWaitState) -> list[str]:
    """What else holds a due waiting job, in words: no worker slot of its actor's class, its key's share."""
    if state.status not in ("pending", "scheduled") or not state.due:
        return []
    reasons = []
    if state.live_workers == 0:
        reasons.append(f"no live worker serves queue {state.queue}")
    elif state.knowing_workers == 0 and state.unclassed_workers == 0:
        reasons.append(f"no live worker serving queue {state.queue} knows actor {state.actor}")
    elif state.knowing_workers > 0 and state.free_workers == 0:
        reasons.append(f"its class ({state.class_}) has no free slot on any worker ({state.slots_busy}/{state.slots} "
                       f"in use on {state.knowing_workers} worker{'s' if state.knowing_workers != 1 else ''})")
    if state.fair and state.ahead_other_keys > 0:
        n = f"more than {AHEAD_CAP - 1:,}" if state.ahead_other_keys >= AHEAD_CAP else f"{state.ahead_other_keys:,}"
        jobs = "ready job of another key comes" if state.ahead_other_keys == 1 else "ready jobs of other keys come"
        reasons.append(f"its key's share is used: {n} {jobs} first")
    return reasons


def describe_wait(state: WaitState) -> str | None:
    """Why a due waiting job has not started, in words (None when nothing holds it)."""
    if state.status not in ("pending", "scheduled") or not state.due:
        return None
    q, a = state.queue, state.actor
    if state.paused_at is not None:
        who = f" by {state.paused_by}" if state.paused_by else ""
        why = f": {state.pause_reason}" if state.pause_reason else ""
        return f"queue {q} is paused{who}{why}"
    key = state.concurrency_key
    holds = [
        (state.queue_concurrency, state.queue_running, f"a concurrency slot of queue {q}"),
        (state.queue_per_key if key else None, state.queue_key_running,
         f"a concurrency slot of key {key} in queue {q}"),
        (state.queue_rate, state.queue_starts, f"the rate limit of queue {q} ({state.queue_rate} per "
                                               f"{state.queue_period or 0:g}s)"),
        (state.actor_concurrency, state.actor_running, f"a concurrency slot of actor {a}"),
        (state.actor_per_key if key else None, state.actor_key_running,
         f"a concurrency slot of key {key} of actor {a}"),
        (state.actor_rate, state.actor_starts, f"the rate limit of actor {a} ({state.actor_rate} per "
                                               f"{state.actor_period or 0:g}s)"),
    ]
    for limit, used, what in holds:
        if limit is not None and used >= limit:
            return f"waiting for {what} ({used}/{limit} in use)"
    return None
