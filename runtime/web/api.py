"""The JSON API under /api/v1 (Starlette routes): bearer auth, problem+json errors, request ids,
Idempotency-Key and expected_revision (If-Match) on the writes. The work is in taskq.web.reads and
taskq.web.actions; this module only speaks HTTP."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from taskq.actors.declaration import default_registry
from taskq.enqueue import DEFAULT_MAX_PAYLOAD_BYTES, prepare_insert
from taskq.exceptions import (
    ConfigurationError,
    DatabaseUnavailable,
    PayloadInvalid,
    SignalInvalid,
    StatementTimeout,
    TokenRevoked,
)
from taskq.ops import durable as durable_ops
from taskq.ops.queues import check_queue_name
from taskq.ops.tokens import Principal
from taskq.web import actions, reads
from taskq.web.actions import Caller, Outcome
from taskq.web.bodies import (
    BulkBody,
    CancelBody,
    EnqueueBody,
    LimitBody,
    M,
    QueueBody,
    RequeueBody,
    SignalBody,
    WeightBody,
    WorkflowCancelBody,
)
from taskq.web.guard import ensure_request_id
from taskq.web.openapi import schema
from taskq.web.problems import PROBLEM_TYPE, Problem, bad_request, forbidden, problem_body
from taskq.web.state import WebState

log = logging.getLogger("taskq.web")

_KEY = re.compile(r'^"?([\x21\x23-\x7e]{1,255})"?$')
_IF_MATCH = re.compile(r'^(?:W/)?"?(\d{1,18})"?$')


UNAVAILABLE_TEXT = "the database is unavailable; try again later"
"""What a client is told while the database cannot be reached (the details go to the server's log)."""
STATEMENT_TIMEOUT_TEXT = "the database did not answer in time (statement timeout); try again later"
DEEP_TEXT = "the body nests too deeply"


# -- plumbing ------------------------------------------------------------------------------------------

def state_of(request: Request) -> WebState:
    st: WebState = request.app.state.taskq
    return st


def request_id(request: Request) -> str:
    return ensure_request_id(request.scope)


def problem_response(request: Request, problem: Problem) -> JSONResponse:
    headers = {"X-Request-Id": request_id(request)}
    if problem.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="taskq"'
    return JSONResponse(problem.body(instance=request.url.path, request_id=request_id(request)),
                        status_code=problem.status, media_type=PROBLEM_TYPE, headers=headers)


def outcome_response(request: Request, outcome: Outcome) -> JSONResponse:
    headers = {"X-Request-Id": request_id(request)}
    if outcome.replayed:
        headers["Idempotent-Replayed"] = "true"
    job = outcome.body.get("job")
    if isinstance(job, dict) and "revision" in job:
        headers["ETag"] = f'"{job["revision"]}"'
    return JSONResponse(outcome.body, status_code=outcome.status,
                        media_type=PROBLEM_TYPE if outcome.is_problem else None, headers=headers)


def ok(request: Request, body: Any, status: int = 200, **headers: str) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers={"X-Request-Id": request_id(request), **headers})


Handler = Callable[[Request], Awaitable[Response]]


def endpoint(fn: Handler) -> Handler:
    """Every error of a handler as the one problem shape, never a traceback."""

    async def wrapped(request: Request) -> Response:
        try:
            return await fn(request)
        except Problem as problem:
            return problem_response(request, problem)
        except (ConfigurationError, PayloadInvalid) as exc:
            return problem_response(request, bad_request(str(exc)))
        except TokenRevoked as exc:
            who = request.scope.get("taskq.principal")
            if isinstance(who, str):
                state_of(request).forget_principal(who)
            log.warning("web: %s %s: %s", request.method, request.url.path, exc)
            return problem_response(request, Problem(401, "UNAUTHENTICATED", "unknown or revoked token"))
        except StatementTimeout as exc:
            log.warning("web: %s %s: %s", request.method, request.url.path, exc)
            return problem_response(request, Problem(503, "UNAVAILABLE", STATEMENT_TIMEOUT_TEXT))
        except DatabaseUnavailable as exc:  # its text names the server: for the log only
            log.warning("web: %s %s: %s", request.method, request.url.path, exc)
            return problem_response(request, Problem(503, "UNAVAILABLE", UNAVAILABLE_TEXT))
        except RecursionError:
            return problem_response(request, bad_request(DEEP_TEXT))
        except Exception:
            log.exception("web: %s %s failed", request.method, request.url.path)
            return problem_response(request, Problem(500, "INTERNAL", "internal error (see the server's log)"))

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


async def principal(request: Request) -> Principal:
    st = state_of(request)
    header = request.headers.get("authorization", "")
    scheme, _, raw = header.partition(" ")
    if not st.config.auth:
        anonymous = await st.principal(None) or _never()
        request.scope["taskq.principal"] = anonymous.name
        return anonymous
    if not header:
        raise Problem(401, "UNAUTHENTICATED", "send Authorization: Bearer <token> (taskq tokens create)")
    if scheme.lower() != "bearer" or not raw.strip():
        raise Problem(401, "UNAUTHENTICATED", "the Authorization header must be 'Bearer <token>'")
    who = await st.principal(raw.strip())
    if who is None:
        raise Problem(401, "UNAUTHENTICATED", "unknown or revoked token")
    request.scope["taskq.principal"] = who.name
    return who


def _never() -> Principal:
    raise AssertionError("an auth-less server always has a principal")


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object (empty body: {}); 413 past the size limit, 400 for anything not JSON."""
    limit = state_of(request).config.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise Problem(413, "TOO_LARGE", f"the body is larger than {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise Problem(413, "TOO_LARGE", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw, parse_constant=_Constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise bad_request(DEEP_TEXT) from None
    constant = _constant_in(body, "") if b"NaN" in raw or b"Infinity" in raw else None
    if constant is not None:
        where, token = constant
        raise bad_request(f"the body is not valid JSON: {where or 'body'}: {token} is not JSON (JSON has no NaN or "
                          "Infinity)")
    if not isinstance(body, dict):
        raise bad_request("the body must be a JSON object")
    return body


class _Constant:
    """NaN, Infinity or -Infinity where the body holds one (Python's json reads them; JSON has none): kept
    so that the refusal can name the field."""

    def __init__(self, token: str) -> None:
        self.token = token


def _constant_in(value: Any, where: str) -> tuple[str, str] | None:
    """The first NaN or Infinity in the parsed body and the field holding it (`a.b`, `items.2`)."""
    if isinstance(value, _Constant):
        return where, value.token
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        found = _constant_in(v, f"{where}.{k}" if where else str(k))
        if found is not None:
            return found
    return None


def parse_body(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()]
        first = errors[0] if errors else {"field": "", "message": "invalid"}
        raise bad_request(f"{first['field'] or 'body'}: {first['message']}", errors=errors) from None


def caller(request: Request, who: Principal) -> Caller:
    raw = request.headers.get("idempotency-key")
    key = None
    if raw is not None:
        match = _KEY.match(raw.strip())
        if match is None:
            raise bad_request("Idempotency-Key must be 1-255 visible ASCII characters (a UUID is best)")
        key = match.group(1)
    return Caller(who, request_id(request), key)


def expected_revision(request: Request, from_body: int | None) -> int | None:
    raw = request.headers.get("if-match")
    if raw is None:
        return from_body
    match = _IF_MATCH.match(raw.strip())
    if match is None:
        raise bad_request("If-Match must be a job revision, e.g. \"3\"")
    header = int(match.group(1))
    if from_body is not None and from_body != header:
        raise bad_request(f"If-Match ({header}) and expected_revision ({from_body}) disagree")
    return header


def fingerprint(request: Request, body: dict[str, Any]) -> str:
    return actions.fingerprint(request.method, request.url.path, body)


# -- reads ---------------------------------------------------------------------------------------------

def _query(request: Request) -> dict[str, list[str]]:
    q: dict[str, list[str]] = {}
    for k, v in request.query_params.multi_items():
        q.setdefault(k, []).append(v)
    return q


@endpoint
async def list_jobs(request: Request) -> Response:
    """GET /jobs: filters status, queue, actor, tag (comma-separated or repeated), parent, created_after,
    created_before, workflow_id, waiting (sleep, signal or any); limit (1-500, default 50) and cursor (the
    previous page's next_cursor)."""
    who = await principal(request)
    page = await reads.job_page(await state_of(request).backend(), who, _query(request))
    return ok(request, {"jobs": [r.model_dump(mode="json") for r in page.rows],
                        "next_cursor": reads.encode_cursor(page.next_after) if page.next_after else None})


@endpoint
async def get_job(request: Request) -> Response:
    who = await principal(request)
    job_id = reads.job_id_of(request.path_params["job_id"])
    detail = await reads.job_detail(await state_of(request).backend(), who, job_id)
    return ok(request, detail, ETag=f'"{detail["job"]["revision"]}"')


def _job_rows(what: str) -> Handler:
    async def rows(request: Request) -> Response:
        who = await principal(request)
        job_id = reads.job_id_of(request.path_params["job_id"])
        page = await reads.job_rows_page(await state_of(request).backend(), who, job_id, what, _query(request))
        return ok(request, page)

    rows.__name__ = f"job_{what}"
    rows.__doc__ = f"""GET /jobs/{{id}}/{what}: the job's {what}, newest first, `limit` and `cursor` as GET /jobs."""
    return endpoint(rows)


@endpoint
async def list_workers(request: Request) -> Response:
    who = await principal(request)
    return ok(request, {"workers": await reads.workers(await state_of(request).backend(), who)})


@endpoint
async def list_schedules(request: Request) -> Response:
    who = await principal(request)
    return ok(request, {"schedules": await reads.schedules(await state_of(request).backend(), who)})


@endpoint
async def get_stats(request: Request) -> Response:
    who = await principal(request)
    st = state_of(request)
    key = f"stats:{who.name}"
    found = st.cached(key) or st.remember(key, await reads.stats(await st.backend(), who, state=st))
    return ok(request, found)


@endpoint
async def list_queues(request: Request) -> Response:
    """GET /queues: every queue of the queues table and every queue with waiting, running or recently
    finished jobs, with its depth, pause and limits; those the token may see with queues:read (or
    queues:write)."""
    who = await principal(request)
    st = state_of(request)
    return ok(request, {"queues": await reads.queues(await st.backend(), who, state=st)})


@endpoint
async def list_cancellations(request: Request) -> Response:
    who = await principal(request)
    st = state_of(request)
    backend = await st.backend()
    rows = await reads.cancellations(backend, who)
    ladders = await reads.cancel_ladders(backend, rows, st.config.cancellation_grace_period,
                                         st.config.cleanup_grace_period)
    return ok(request, {"cancellations": [r.model_dump(mode="json") | {"cancel_ladder": lad}
                                          for r, lad in zip(rows, ladders, strict=True)]})


# -- writes --------------------------------------------------------------------------------------------

def _with_revision(body: dict[str, Any], expected: int | None) -> dict[str, Any]:
    """The body a receipt's fingerprint covers: the effective expected revision folded in, so that the same
    key sent with another If-Match is another request (422), and If-Match "3" and a body's
    `expected_revision: 3` are the same one."""
    return body if expected is None else body | {"expected_revision": expected}


@endpoint
async def cancel_job(request: Request) -> Response:
    who = await principal(request)
    job_id = reads.job_id_of(request.path_params["job_id"])
    body = await json_body(request)
    parsed = parse_body(CancelBody, body)
    expected = expected_revision(request, parsed.expected_revision)
    outcome = await actions.cancel(
        await state_of(request).backend(), caller(request, who), job_id, reason=parsed.reason,
        expected_revision=expected, request_fingerprint=fingerprint(request, _with_revision(body, expected)))
    response = outcome_response(request, outcome)
    if outcome.status == 202:
        # a path, not a URL: built from nothing the client sent (its Host)
        base = str(request.scope.get("app_root_path", "")).rstrip("/")
        response.headers["Location"] = base + str(request.app.url_path_for("get_job", job_id=str(job_id)))
    return response


@endpoint
async def requeue_job(request: Request) -> Response:
    who = await principal(request)
    job_id = reads.job_id_of(request.path_params["job_id"])
    body = await json_body(request)
    parsed = parse_body(RequeueBody, body)
    st = state_of(request)
    expected = expected_revision(request, parsed.expected_revision)
    outcome = await actions.requeue(
        await st.backend(), caller(request, who), job_id, reason=parsed.reason, attempts=parsed.attempts,
        expected_revision=expected, registry=st.config.registry or default_registry,
        request_fingerprint=fingerprint(request, _with_revision(body, expected)))
    return outcome_response(request, outcome)


@endpoint
async def signal_job(request: Request) -> Response:
    """POST /jobs/{id}:signal: send a signal to the job (jobs:signal on its queue)."""
    who = await principal(request)
    job_id = reads.job_id_of(request.path_params["job_id"])
    body = await json_body(request)
    parsed = parse_body(SignalBody, body)
    try:
        name = durable_ops.check_name(parsed.name, "signal")
    except SignalInvalid as exc:
        raise bad_request(f"name: {exc}", errors=[{"field": "name", "message": str(exc)}]) from None
    try:
        text = durable_ops.check_signal_payload(parsed.payload)
    except SignalInvalid as exc:
        raise bad_request(f"payload: {exc}", errors=[{"field": "payload", "message": str(exc)}]) from None
    outcome = await actions.signal(await state_of(request).backend(), caller(request, who), job_id, name=name,
                                   payload_json=text, request_fingerprint=fingerprint(request, body))
    return outcome_response(request, outcome)


@endpoint
async def cancel_workflow(request: Request) -> Response:
    """POST /workflows/{id}:cancel: cancel every unfinished member of the workflow (jobs:cancel on all its
    queues)."""
    who = await principal(request)
    workflow_id = reads.workflow_id_of(request.path_params["workflow_id"])
    body = await json_body(request)
    parsed = parse_body(WorkflowCancelBody, body)
    outcome = await actions.cancel_workflow(await state_of(request).backend(), caller(request, who), workflow_id,
                                            reason=parsed.reason, request_fingerprint=fingerprint(request, body))
    return outcome_response(request, outcome)


@endpoint
async def enqueue_job(request: Request) -> Response:
    who = await principal(request)
    if not who.may("jobs:enqueue"):
        raise forbidden("jobs:enqueue", None)
    body = await json_body(request)
    parsed = parse_body(EnqueueBody, body)
    st = state_of(request)
    job = prepare_insert(
        parsed.actor, parsed.payload, registry=st.config.registry or default_registry,
        max_payload_bytes=min(DEFAULT_MAX_PAYLOAD_BYTES, st.config.max_body_bytes), queue=parsed.queue,
        priority=parsed.priority, tags=parsed.tags, scheduled_at=parsed.scheduled_at,
        max_attempts=parsed.max_attempts, schedule_to_close=parsed.schedule_to_close,
        unique_key=parsed.unique_key, unique_scope=parsed.unique_scope, fairness_key=parsed.fairness_key)
    outcome = await actions.enqueue(await st.backend(), caller(request, who), job,
                                    request_fingerprint=fingerprint(request, body))
    return outcome_response(request, outcome)


def _bulk(verb: str) -> Handler:
    async def bulk(request: Request) -> Response:
        who = await principal(request)
        body = await json_body(request)
        parsed = parse_body(BulkBody, body)
        if verb == "cancel" and parsed.attempts is not None:
            raise bad_request("attempts is for requeue only")
        query = {k: [v] if isinstance(v, str) else v for k, v in parsed.filter.items()}
        flt = reads.as_job_filter(reads.parse_filter(query, allowed=[f for f in reads.JOB_FILTERS if f != "parent"]))
        if flt.is_empty:
            raise bad_request("refusing a bulk action with an empty filter: name a status, queue, actor, tag or time")
        st = state_of(request)
        backend = await st.backend()
        who_is = caller(request, who)
        print_ = fingerprint(request, body)
        if verb == "cancel":
            outcome = await actions.bulk_cancel(backend, who_is, flt, reason=parsed.reason, limit=parsed.limit,
                                                request_fingerprint=print_)
        else:
            outcome = await actions.bulk_requeue(backend, who_is, flt, reason=parsed.reason, attempts=parsed.attempts,
                                                 limit=parsed.limit, registry=st.config.registry or default_registry,
                                                 request_fingerprint=print_)
        return outcome_response(request, outcome)

    bulk.__name__ = f"bulk_{verb}"
    return endpoint(bulk)


def _schedule(verb: str) -> Handler:
    async def act(request: Request) -> Response:
        who = await principal(request)
        body = await json_body(request)
        if body:
            raise bad_request(f"{verb} takes no body fields, got {sorted(body)[0]!r}")
        outcome = await actions.schedule_action(await state_of(request).backend(), caller(request, who),
                                                request.path_params["name"], verb,
                                                request_fingerprint=fingerprint(request, body))
        return outcome_response(request, outcome)

    act.__name__ = f"schedule_{verb}"
    return endpoint(act)


def _queue(verb: str) -> Handler:
    async def act(request: Request) -> Response:
        who = await principal(request)
        body = await json_body(request)
        parsed = parse_body(QueueBody, body)
        name = check_queue_name(request.path_params["name"])
        outcome = await actions.queue_action(await state_of(request).backend(), caller(request, who), name, verb,
                                             reason=parsed.reason, request_fingerprint=fingerprint(request, body))
        return outcome_response(request, outcome)

    act.__name__ = f"queue_{verb}"
    return endpoint(act)


@endpoint
async def limit_queue(request: Request) -> Response:
    """POST /queues/{name}:limit: set or remove the queue's fleet-wide limits (queues:write)."""
    who = await principal(request)
    body = await json_body(request)
    parsed = parse_body(LimitBody, body)
    name = check_queue_name(request.path_params["name"])
    change = {k: getattr(parsed, k) for k in actions.LIMIT_FIELDS if k in parsed.model_fields_set}
    outcome = await actions.queue_limit(await state_of(request).backend(), caller(request, who), name, change,
                                        reason=parsed.reason, request_fingerprint=fingerprint(request, body))
    return outcome_response(request, outcome)


@endpoint
async def queue_keys(request: Request) -> Response:
    """GET /queues/{name}/keys: per fairness key of the queue its ready, scheduled and running jobs, the jobs
    started in the last minute and its weight (queues:read)."""
    who = await principal(request)
    name = check_queue_name(request.path_params["name"])
    return ok(request, await reads.queue_keys(await state_of(request).backend(), who, name))


@endpoint
async def put_fairness_weight(request: Request) -> Response:
    """PUT /queues/{name}/fairness-weights/{key}: set a fairness key's weight (queues:write); the key
    `~empty` is the jobs enqueued without a key (reads.EMPTY_KEY)."""
    who = await principal(request)
    body = await json_body(request)
    parsed = parse_body(WeightBody, body)
    name = check_queue_name(request.path_params["name"])
    key = reads.fairness_key_of(request.path_params["key"])
    outcome = await actions.queue_weight(await state_of(request).backend(), caller(request, who), name, key,
                                         parsed.weight, reason=parsed.reason,
                                         request_fingerprint=fingerprint(request, body))
    return outcome_response(request, outcome)


@endpoint
async def openapi(request: Request) -> Response:
    return ok(request, schema())


async def not_found_route(request: Request) -> Response:
    return problem_response(request, Problem(404, "NOT_FOUND", f"no API route {request.method} {request.url.path}"))


def routes() -> list[BaseRoute]:
    # the `:verb` routes come first: /jobs/{job_id} would also match `<id>:cancel`
    return [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/jobs:cancel", _bulk("cancel"), methods=["POST"]),
        Route("/jobs:requeue", _bulk("requeue"), methods=["POST"]),
        Route("/jobs/{job_id}:cancel", cancel_job, methods=["POST"]),
        Route("/jobs/{job_id}:requeue", requeue_job, methods=["POST"]),
        Route("/jobs/{job_id}:signal", signal_job, methods=["POST"]),
        Route("/workflows/{workflow_id}:cancel", cancel_workflow, methods=["POST"]),
        Route("/jobs/{job_id}/events", _job_rows("events"), methods=["GET"]),
        Route("/jobs/{job_id}/audit", _job_rows("audit"), methods=["GET"]),
        Route("/jobs/{job_id}", get_job, methods=["GET"], name="get_job"),
        Route("/jobs", list_jobs, methods=["GET"]),
        Route("/jobs", enqueue_job, methods=["POST"]),
        Route("/workers", list_workers, methods=["GET"]),
        Route("/schedules/{name}:pause", _schedule("pause"), methods=["POST"]),
        Route("/schedules/{name}:resume", _schedule("resume"), methods=["POST"]),
        Route("/schedules/{name}:trigger", _schedule("trigger"), methods=["POST"]),
        Route("/schedules", list_schedules, methods=["GET"]),
        Route("/queues/{name}:pause", _queue("pause"), methods=["POST"]),
        Route("/queues/{name}:resume", _queue("resume"), methods=["POST"]),
        Route("/queues/{name}:limit", limit_queue, methods=["POST"]),
        Route("/queues/{name}/keys", queue_keys, methods=["GET"]),
        Route("/queues/{name}/fairness-weights/{key:path}", put_fairness_weight, methods=["PUT"]),
        Route("/queues", list_queues, methods=["GET"]),
        Route("/stats", get_stats, methods=["GET"]),
        Route("/cancellations", list_cancellations, methods=["GET"]),
        Route("/{rest:path}", not_found_route, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]


__all__ = ["problem_body", "routes"]
