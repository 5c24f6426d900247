"""The reads of the web API and the dashboard, framework-free: filters parsed from a query string, keyset
pages of jobs, a job's detail, workers, schedules, cancels in flight and the overview's stats. Every list
is limited to the queues the caller may read."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq.backend import Backend
from taskq.backend import dependencies as dependency_store
from taskq.backend import web as web_store
from taskq.backend.dependencies import DependencyEdge
from taskq.backend.web import JobPage, fetch_all
from taskq.checks import check_text
from taskq.exceptions import ConfigurationError, QueueNotFound
from taskq.models import JobAttempt, JobEvent, JobFilter, JobRow, JobStatus, QueueLimits
from taskq.ops import durable as durable_ops
from taskq.ops import queues as queue_ops
from taskq.ops import schedules as schedule_ops
from taskq.ops.tokens import Principal
from taskq.settings import WorkerSettings
from taskq.web.problems import Problem, bad_request, forbidden, not_found

if TYPE_CHECKING:
    from taskq.web.state import WebState

JOB_FILTERS = ("status", "queue", "actor", "tag", "parent", "created_after", "created_before", "workflow_id",
               "waiting")
WAITING = ("sleep", "signal", "any")
PAGE_PARAMS = ("limit", "cursor")
DEFAULT_PAGE = 50
MAX_PAGE = 500
DETAIL_CHILDREN = 100
DETAIL_ROWS = 100
"""The job detail carries at most this many of the newest events, attempts and audit rows (each list
with its `more` flag); GET /jobs/{id}/events and /audit page through the rest."""
HELD_SHOWN = 20
JOB_ACTIONS = ("jobs:read", "jobs:cancel", "jobs:requeue")


def job_id_of(text: str) -> UUID:
    return _uuid_of(text, "job")


def workflow_id_of(text: str) -> UUID:
    return _uuid_of(text, "workflow")


def _uuid_of(text: str, what: str) -> UUID:
    try:
        return UUID(text)
    except ValueError:
        raise bad_request(f"not a {what} id (expected a UUID): {text[:80]!r}") from None


def _many(values: Sequence[str]) -> list[str]:
    out = [v.strip() for raw in values for v in raw.split(",") if v.strip()]
    for v in out:
        try:
            check_text("a filter value", v)
        except ConfigurationError as exc:
            raise bad_request(str(exc)) from None
    return out


def _time(name: str, values: Sequence[str]) -> datetime | None:
    if not values or not values[-1]:
        return None
    try:
        when = datetime.fromisoformat(values[-1])
    except ValueError:
        raise bad_request(f"{name} must be an ISO 8601 time with a timezone, got {values[-1][:80]!r}") from None
    if when.tzinfo is None:
        raise bad_request(f"{name} must carry a timezone (e.g. 2030-01-01T09:00:00Z)")
    return when


def parse_filter(query: Mapping[str, Sequence[str]], *, allowed: Sequence[str] = JOB_FILTERS) -> dict[str, Any]:
    """The job_page parameters of a query string's filters; 400 INVALID_ARGUMENT for an unknown name or
    a bad value (never a silent ignore: a typo would widen a bulk action)."""
    unknown = sorted(set(query) - set(allowed) - set(PAGE_PARAMS))
    if unknown:
        raise bad_request(f"unknown filter {unknown[0]!r}; filters: {', '.join(allowed)}")
    statuses = _many(query.get("status", ()))
    for s in statuses:
        if s not in JobStatus.__members__.values():
            raise bad_request(f"unknown status {s!r}; statuses: {', '.join(JobStatus)}")
    parents = _many(query.get("parent", ()))
    workflows = _many(query.get("workflow_id", ()))
    waiting = _many(query.get("waiting", ()))
    if waiting and waiting[-1] not in WAITING:
        raise bad_request(f"waiting must be one of {', '.join(WAITING)}, got {waiting[-1][:80]!r}")
    return {
        "statuses": statuses or None,
        "queues": _many(query.get("queue", ())) or None,
        "actors": _many(query.get("actor", ())) or None,
        "tags": _many(query.get("tag", ())) or None,
        "parent_id": job_id_of(parents[-1]) if parents else None,
        "created_after": _time("created_after", query.get("created_after", ())),
        "created_before": _time("created_before", query.get("created_before", ())),
        "workflow_id": workflow_id_of(workflows[-1]) if workflows else None,
        "waiting": waiting[-1] if waiting else None,
    }


def as_job_filter(params: Mapping[str, Any]) -> JobFilter:
    """The JobFilter of parsed filters (for the bulk actions, which select through the same filters)."""
    if params.get("parent_id") is not None:
        raise bad_request("the bulk actions do not filter on parent")
    return JobFilter(
        statuses=tuple(JobStatus(s) for s in params["statuses"]) if params["statuses"] else None,
        queues=tuple(params["queues"]) if params["queues"] else None,
        actors=tuple(params["actors"]) if params["actors"] else None,
        tags=tuple(params["tags"]) if params["tags"] else None,
        created_after=params["created_after"],
        created_before=params["created_before"],
        workflow_id=params.get("workflow_id"),
        waiting=params.get("waiting"),
    )


def encode_cursor(after: tuple[datetime, UUID]) -> str:
    return base64.urlsafe_b64encode(f"{after[0].isoformat()}|{after[1]}".encode()).decode().rstrip("=")


def decode_cursor(text: str) -> tuple[datetime, UUID]:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        at, _, jid = raw.partition("|")
        when = datetime.fromisoformat(at)
        if when.tzinfo is None:
            raise ValueError(at)
        return when, UUID(jid)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise bad_request("cursor is not one this server gave out") from None


def page_limit(query: Mapping[str, Sequence[str]]) -> int:
    raw = query.get("limit", ())
    if not raw:
        return DEFAULT_PAGE
    try:
        n = int(raw[-1])
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_PAGE:
        raise bad_request(f"limit must be an integer from 1 to {MAX_PAGE}, got {raw[-1][:20]!r}")
    return n


async def job_page(backend: Backend, who: Principal, query: Mapping[str, Sequence[str]], *,
                   action: str | None = None) -> JobPage:
    """One page of the jobs the caller may read (and, with `action`, act on: a bulk action's preview)."""
    if not who.may("jobs:read"):
        raise forbidden("jobs:read", None)
    if action is not None and not who.may(action):
        raise forbidden(action, None)
    params = parse_filter(query)
    cursor = query.get("cursor", ())
    after = decode_cursor(cursor[-1]) if cursor and cursor[-1] else None
    params |= {"readable": who.readable("jobs:read"), "allowed": who.readable(action) if action else None,
               "uncancelled": False,
               "after_at": after[0] if after else None, "after_id": after[1] if after else None}
    return await web_store.job_page(backend, params, page_limit(query))


async def readable_job(backend: Backend, who: Principal, job_id: UUID) -> JobRow:
    """The row, if the caller may read it. 404 for a job it may neither read nor act on (as for a job that
    does not exist); 403, naming no queue, for one it may only cancel or requeue."""
    row = await backend.get(job_id)
    if row is None or not any(who.may(a, row.queue) for a in JOB_ACTIONS):
        raise not_found(f"job {job_id}")
    if not who.may("jobs:read", row.queue):
        raise forbidden("jobs:read", None)
    return row


async def job_detail(backend: Backend, who: Principal, job_id: UUID) -> dict[str, Any]:
    """The row (with its revision), events, attempts, audit, parents and children, the cancel ladder's
    clocks, its durable state (`steps`: the steps, sleeps and waits its attempts stored, oldest first, each
    with its result; `signals`: the signals sent to it, with `consumed_by` naming the wait that took each;
    `suspended`: what a sleeping or signal-waiting job waits for, and until when), and `waiting`: why a due
    waiting job has not started (its queue is paused, a limit is used up,
    no worker has a free slot of its actor's isolation class, its fairness key's share is used), or null.
    `parents` are the jobs this one depends on and `children` the jobs that depend on it (the edges of
    taskq.job_dependencies, each with the other job's status now and how the edge resolved), then the jobs
    spawned with parent_id (a spawned child shows as {"id", "status", "actor", "spawned": true}); edges to
    jobs of queues the caller may not read are left out."""
    row = await readable_job(backend, who, job_id)
    events = await fetch_all(backend, "job_events_page", {"id": job_id, "before": None, "limit": DETAIL_ROWS + 1})
    attempts = await fetch_all(backend, "job_attempts_newest", {"id": job_id, "limit": DETAIL_ROWS + 1})
    async with backend.connection() as conn:
        edges = await dependency_store.dependencies(conn, job_id)
    spawned = await web_store.jobs(backend, "job_children", {"id": job_id, "limit": DETAIL_CHILDREN})
    audit = await fetch_all(backend, "audit_for_job", {"id": job_id, "before": None, "limit": DETAIL_ROWS + 1})
    ladder = (await cancel_ladders(backend, [row]))[0] if row.cancel_requested_at is not None else None
    others = [e.job_id for e in edges] + ([row.parent_id] if row.parent_id is not None else [])
    readable = await _readable_ids(backend, who, others)
    parents = [_edge(e) for e in edges if e.side == "parent" and e.job_id in readable]
    children = [_edge(e) for e in edges if e.side == "child" and e.job_id in readable][:DETAIL_CHILDREN]
    if row.parent_id is not None and row.parent_id in readable and all(p["id"] != str(row.parent_id)
                                                                       for p in parents):
        parents.append({"id": str(row.parent_id), "spawned": True})
    seen = {c["id"] for c in children}
    children += [{"id": str(c.id), "status": c.status, "actor": c.actor, "spawned": True} for c in spawned
                 if str(c.id) not in seen and who.may("jobs:read", c.queue)]
    job = row.model_dump(mode="json")
    steps = await durable_ops.job_steps(backend, job_id)
    signals = await durable_ops.job_signals(backend, job_id)
    waiting = await queue_ops.job_wait_reason(backend, job_id) if row.status in (JobStatus.PENDING,
                                                                                 JobStatus.SCHEDULED) else None
    if row.parent_id is not None and row.parent_id not in readable:
        job["parent_id"] = None  # the spawning job sits in a queue the caller may not read
    return {
        "job": job,
        "events": [_event(e) for e in reversed(events[:DETAIL_ROWS])],
        "attempts": [JobAttempt.model_validate(a).model_dump(mode="json") for a in reversed(attempts[:DETAIL_ROWS])],
        "parents": parents,
        "children": children,
        "audit": [_jsonable(a) for a in reversed(audit[:DETAIL_ROWS])],
        "more": {"events": len(events) > DETAIL_ROWS, "attempts": len(attempts) > DETAIL_ROWS,
                 "audit": len(audit) > DETAIL_ROWS},
        "cancel_ladder": ladder,
        "waiting": waiting,
        "suspended": suspension(row),
        "steps": [_jsonable(asdict(st)) for st in steps[:DETAIL_ROWS]],
        "signals": [_jsonable(asdict(sg)) for sg in signals[-DETAIL_ROWS:]],
        "more_durable": {"steps": len(steps) > DETAIL_ROWS, "signals": len(signals) > DETAIL_ROWS},
    }


def suspension(row: JobRow) -> dict[str, Any] | None:
    """What a sleeping or signal-waiting job waits for (None for any other row): {"kind": "sleep" | "signal",
    "signal": the name awaited or None, "until": ISO time or None without timeout, "text": in words}."""
    found = row.suspension
    if found is None:
        return None
    until = None if found.until is None else found.until.isoformat()
    if found.kind == "sleep":
        text = f"sleeping until {until}"
    else:
        text = f"waiting for signal {found.signal!r} " + ("(no timeout)" if until is None else f"until {until}")
    return {"kind": found.kind, "signal": found.signal, "until": until, "text": text}


def _event(row: dict[str, Any]) -> dict[str, Any]:
    return JobEvent.model_validate(row).model_dump(mode="json")


def _id_cursor(query: Mapping[str, Sequence[str]]) -> int | None:
    raw = query.get("cursor", ())
    if not raw or not raw[-1]:
        return None
    try:
        text = base64.urlsafe_b64decode(raw[-1] + "=" * (-len(raw[-1]) % 4)).decode()
        value = int(text)
    except (ValueError, binascii.Error, UnicodeDecodeError):
        value = 0
    if not 0 < value < 2**63:
        raise bad_request("cursor is not one this server gave out")
    return value


def _encode_id_cursor(value: int) -> str:
    return base64.urlsafe_b64encode(str(value).encode()).decode().rstrip("=")


async def job_rows_page(backend: Backend, who: Principal, job_id: UUID, what: str,
                        query: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """GET /jobs/{id}/events or /audit: one page of the job's timeline or audit rows, newest first, with
    the conventions of GET /jobs (`limit` 1-500, default 50; `cursor` the last page's `next_cursor`)."""
    unknown = sorted(set(query) - set(PAGE_PARAMS))
    if unknown:
        raise bad_request(f"unknown parameter {unknown[0]!r}; parameters: {', '.join(PAGE_PARAMS)}")
    limit = page_limit(query)
    before = _id_cursor(query)
    await readable_job(backend, who, job_id)
    name = "job_events_page" if what == "events" else "audit_for_job"
    rows = await fetch_all(backend, name, {"id": job_id, "before": before, "limit": limit + 1})
    more = len(rows) > limit
    rows = rows[:limit]
    return {what: [_event(r) if what == "events" else _jsonable(r) for r in rows],
            "next_cursor": _encode_id_cursor(rows[-1]["id"]) if more and rows else None}


def _edge(e: DependencyEdge) -> dict[str, Any]:
    return {"id": str(e.job_id), "status": e.status, "actor": e.actor,
            "resolved_at": e.resolved_at.isoformat() if e.resolved_at else None, "parent_status": e.parent_status}


async def _readable_ids(backend: Backend, who: Principal, ids: list[UUID]) -> set[UUID]:
    """Which of these jobs the caller may read (a job retention deleted shows: nothing of it is left)."""
    if not ids or who.readable("jobs:read") is None:
        return set(ids)
    rows = await backend.job_list(JobFilter(ids=tuple(ids)), limit=len(ids))
    hidden = {r.id for r in rows if not who.may("jobs:read", r.queue)}
    return set(ids) - hidden


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else str(v) if isinstance(v, UUID) else v)
            for k, v in row.items()}


def graces(cancellation: float | None, cleanup: float | None) -> tuple[float, float]:
    if cancellation is not None and cleanup is not None:
        return cancellation, cleanup
    s = WorkerSettings()
    return (cancellation if cancellation is not None else s.cancellation_grace_period,
            cleanup if cleanup is not None else s.cleanup_grace_period)


async def cancel_ladders(backend: Backend, rows: list[JobRow], cancellation_grace: float | None = None,
                         cleanup_grace: float | None = None) -> list[dict[str, Any]]:
    """Per row with a cancel request: its phase, and the seconds left in the current grace window
    (phase 1: until the worker forces; phase 2: until it abandons), from the fleet's grace settings."""
    grace, cleanup = graces(cancellation_grace, cleanup_grace)
    escalated = {r["job_id"]: r["at"] for r in await fetch_all(
        backend, "job_escalated_at", {"ids": [r.id for r in rows if r.cancel_phase >= 2]})} if any(
        r.cancel_phase >= 2 for r in rows) else {}
    now = datetime.now(rows[0].created_at.tzinfo) if rows else datetime.now()
    out = []
    for r in rows:
        requested = r.cancel_requested_at
        assert requested is not None
        if r.status != JobStatus.RUNNING:
            out.append({"job_id": str(r.id), "phase": r.cancel_phase, "window": None, "seconds_left": None})
            continue
        if r.cancel_phase >= 2:
            start = escalated.get(r.id, requested + timedelta(seconds=grace))
            ends = start + timedelta(seconds=cleanup)
            window = "cleanup (forced, then abandoned)"
        else:
            ends = requested + timedelta(seconds=grace)
            window = "cancellation grace (cooperative, then forced)"
        out.append({"job_id": str(r.id), "phase": r.cancel_phase, "window": window,
                    "requested_at": requested.isoformat(), "window_ends_at": ends.isoformat(),
                    "seconds_left": max(0.0, (ends - now).total_seconds())})
    return out


async def cancellations(backend: Backend, who: Principal, limit: int = 500) -> list[JobRow]:
    if not who.may("jobs:read"):
        raise forbidden("jobs:read", None)
    return await web_store.jobs(backend, "jobs_cancelling", {"readable": who.readable(), "limit": limit})


async def workers(backend: Backend, who: Principal) -> list[dict[str, Any]]:
    """The worker registry; a worker shows when the caller may read one of its queues (`workers:read`), with
    only those queues, and `held` counts (and `held_jobs` lists) only the jobs of queues it may read
    (`jobs:read`)."""
    if not who.may("workers:read"):
        raise forbidden("workers:read", None)
    rows = [r for r in await fetch_all(backend, "workers_list", {"readable": who.readable("jobs:read")})
            if any(who.may("workers:read", q) for q in r["queues"])]
    for r in rows:
        r["queues"] = [q for q in r["queues"] if who.may("workers:read", q)]
        held = await web_store.jobs(backend, "worker_held_jobs", {"id": r["id"], "limit": HELD_SHOWN})
        r["held_jobs"] = [{"id": str(j.id), "actor": j.actor, "cancel_phase": j.cancel_phase,
                           "lock_expires_at": j.lock_expires_at.isoformat() if j.lock_expires_at else None}
                          for j in held if who.may("jobs:read", j.queue)]
    return [_jsonable(r) for r in rows]


async def schedules(backend: Backend, who: Principal) -> list[dict[str, Any]]:
    if not who.may("schedules:read"):
        raise forbidden("schedules:read", None)
    return [s.model_dump(mode="json") for s in await schedule_ops.list_schedules(backend)
            if who.may("schedules:read", s.queue)]


def queue_patterns(who: Principal) -> list[str] | None:
    """LIKE patterns of the queues whose state (pause, limits) the caller may see: `queues:read`, and
    `queues:write` (which changes that state); None: every queue."""
    read, write = who.readable("queues:read"), who.readable("queues:write")
    return None if read is None or write is None else read + write


def may_see_queue(who: Principal, name: str | None = None) -> bool:
    return who.may("queues:read", name) or who.may("queues:write", name)


async def stats(backend: Backend, who: Principal, minutes: int = 60, *, state: WebState | None = None
                ) -> dict[str, Any]:
    """Per queue: depth by status (waiting and running), the oldest waiting job, and per minute of the
    last hour the finished jobs by status with run-time p50/p95; each queue's `paused` (with who, when
    and why) and `limits` from taskq.queues (a queue with a row there shows even with no jobs). With
    `state`, the last hour's figures are reused for RECENT_CACHE_SECONDS (they read every job finished
    in the hour).

    Grants: the depth and the last hour's figures cover the queues of `jobs:read`; `paused`, `pause` and
    `limits` those of `queues:read` (or `queues:write`), and are null for a queue the caller sees only
    through `jobs:read`. 403 without either grant."""
    if not who.may("jobs:read") and not may_see_queue(who):
        raise forbidden("jobs:read", None)
    found = await _gather(backend, who.readable(), queue_patterns(who), minutes, state)
    for name, q in found["queues"].items():
        if not may_see_queue(who, name):
            q.update(paused=None, pause=None, limits=None)
    return found


async def queues(backend: Backend, who: Principal, *, state: WebState | None = None) -> list[dict[str, Any]]:
    """GET /queues: the queues whose state the caller may see (`queues:read` or `queues:write`), with
    their depth, pause and limits. 403 without either grant on any queue."""
    if not may_see_queue(who):
        raise forbidden("queues:read", None)
    patterns = queue_patterns(who)
    found = await _gather(backend, patterns, patterns, 60, state)
    return [{"name": name, "depth": q["depth"], "paused": q["paused"], "limits": q["limits"]}
            for name, q in sorted(found["queues"].items())]


async def _gather(backend: Backend, readable: list[str] | None, shown: list[str] | None, minutes: int,
                  state: WebState | None) -> dict[str, Any]:
    from taskq.web.state import RECENT_CACHE_SECONDS

    depth = await fetch_all(backend, "stats_depth", {"readable": readable})
    recent_key = f"recent:{minutes}:{readable}"
    recent = state.cached(recent_key) if state is not None else None
    if recent is None:
        recent = await fetch_all(backend, "stats_recent", {"readable": readable, "minutes": minutes})
        if state is not None:
            state.remember(recent_key, recent, RECENT_CACHE_SECONDS)
    queues: dict[str, dict[str, Any]] = {}
    for r in await fetch_all(backend, "stats_queues", {"readable": shown}):
        q = queues.setdefault(r["name"], _queue_entry())
        q["paused"] = r["paused_at"] is not None
        q["pause"] = {"at": r["paused_at"].isoformat(), "by": r["paused_by"], "reason": r["pause_reason"]} \
            if r["paused_at"] is not None else None
        q["limits"] = QueueLimits(concurrency=r["concurrency_limit"], concurrency_per_key=r["concurrency_per_key"],
                                  rate_limit=r["rate_limit"], rate_period=r["rate_period"]).model_dump(mode="json")
    for r in depth:
        q = queues.setdefault(r["queue"], _queue_entry())
        q["depth"][r["status"]] = r["n"]
        if r["status"] == "pending" and r["oldest"] is not None:
            q["oldest_pending_at"] = r["oldest"].isoformat()
    for r in recent:
        q = queues.setdefault(r["queue"], _queue_entry())
        q["last_hour"][r["status"]] = q["last_hour"].get(r["status"], 0) + r["n"]
        q["per_minute"].append({"minute": r["minute"].isoformat(), "status": r["status"], "n": r["n"],
                                "run_p50": r["p50"], "run_p95": r["p95"]})
    return {"window_minutes": minutes, "queues": queues}


async def queue_limits(backend: Backend, who: Principal, name: str) -> QueueLimits:
    """One queue's limits (none when it has no taskq.queues row), from the small queues table only."""
    if not may_see_queue(who, name):
        raise forbidden("queues:read", name)
    for r in await fetch_all(backend, "stats_queues", {"readable": None}):  # a small table; the grant is checked
        if r["name"] == name:
            return QueueLimits(concurrency=r["concurrency_limit"], concurrency_per_key=r["concurrency_per_key"],
                               rate_limit=r["rate_limit"], rate_period=r["rate_period"])
    return QueueLimits()


EMPTY_KEY = "~empty"
"""How the empty fairness key (jobs enqueued without one) is spelled in a URL's path: `~empty`. A key that
itself starts with `~` is written with one more (`~~x` is the key `~x`); any other `~` start is refused."""


def fairness_key_of(segment: str) -> str:
    """The fairness key a URL path segment names (EMPTY_KEY: the empty key), checked; 400 naming it."""
    if segment == EMPTY_KEY:
        return ""
    if segment.startswith("~~"):
        segment = segment[1:]
    elif segment.startswith("~"):
        raise bad_request(f"key: {segment[:80]!r} is no fairness key: write {EMPTY_KEY} for the jobs without a key "
                          "and double a leading '~' (~~x is the key ~x)")
    try:
        return queue_ops.check_weight_key(segment)
    except ConfigurationError as exc:
        raise bad_request(str(exc)) from None


def key_segment(key: str) -> str:
    """The path segment of a fairness key (the inverse of fairness_key_of), before percent-encoding."""
    return EMPTY_KEY if key == "" else "~" + key if key.startswith("~") else key


async def queue_keys(backend: Backend, who: Principal, name: str) -> dict[str, Any]:
    """GET /queues/{name}/keys: per fairness key of the queue ('' = jobs without a key) its ready, scheduled
    and running jobs, the jobs started in the last minute and its weight, and the queue's weights other
    than 1 (queues:read or queues:write on it). 404 for a queue the database does not know."""
    if not may_see_queue(who, name):
        raise forbidden("queues:read", name)
    try:
        keys = await queue_ops.fair_keys(backend, name)
    except QueueNotFound:
        raise not_found(f"queue named {name!r} (no worker serves it and no unfinished job names it)") from None
    weights = await queue_ops.fairness_weights(backend, name)
    return {"queue": name, "keys": [k.model_dump(mode="json") for k in keys], "weights": weights,
            "empty_key": EMPTY_KEY}


def _queue_entry() -> dict[str, Any]:
    """A queue without a taskq.queues row: not paused, no limits."""
    return {"depth": {}, "oldest_pending_at": None, "last_hour": {}, "per_minute": [],
            "paused": False, "pause": None, "limits": QueueLimits().model_dump(mode="json")}


def check_problem(exc: Exception) -> Problem:
    """A ConfigurationError of a service function's checks as a 400."""
    return bad_request(str(exc))


WORKFLOW_NODES = 500
"""The most members the workflow page draws (the oldest first); the API's GET /jobs?workflow_id= lists all."""


async def workflow(backend: Backend, who: Principal, workflow_id: UUID) -> dict[str, Any]:
    """A workflow's members (those the caller may read, at most WORKFLOW_NODES, oldest first), its edges among
    them (job_dependencies parent -> child, and parent_id for a child a member enqueued with ctx.jobs.enqueue),
    its status counts, and whether the caller may cancel it (jobs:cancel on every member's queue). 404 when
    no job carries the id or the caller may read none of them."""
    if not who.may("jobs:read"):
        raise forbidden("jobs:read", None)
    rows = await web_store.jobs(backend, "workflow_members", {"workflow_id": workflow_id,
                                                              "limit": WORKFLOW_NODES + 1})
    more = len(rows) > WORKFLOW_NODES
    queues = {r["queue"] for r in await fetch_all(backend, "workflow_queues", {"workflow_id": workflow_id})}
    members = [r for r in rows[:WORKFLOW_NODES] if who.may("jobs:read", r.queue)]
    if not members:
        raise not_found(f"workflow {workflow_id}")
    ids = {r.id for r in members}
    edges = [(r["parent_id"], r["child_id"]) for r in await fetch_all(backend, "workflow_edges",
                                                                        {"workflow_id": workflow_id})]
    edges += [(r.parent_id, r.id) for r in members if r.parent_id is not None]
    counts: dict[str, int] = {}
    for r in members:
        counts[str(r.status)] = counts.get(str(r.status), 0) + 1
    return {"workflow_id": workflow_id, "members": members, "more": more or len(members) < min(len(rows),
                                                                                              WORKFLOW_NODES),
            "edges": sorted({(a, b) for a, b in edges if a in ids and b in ids}, key=str),
            "counts": counts, "cancellable": all(who.may("jobs:cancel", q) for q in queues),
            "unfinished": any(not r.is_terminal for r in members)}
