"""The dashboard: server-rendered pages (Jinja2), htmx for the live regions (short polling of the page's
own region every few seconds: no new NOTIFY anywhere), forms for the writes.

Sessions (taskq.web.sessions): a token login opens a server-side session and sets an HttpOnly,
SameSite=Strict cookie with a Max-Age holding its random id, never the token (`Secure` unless served over
plain HTTP on a loopback address, or as WebConfig.secure_cookies says). Each page resolves the session in
the database: logout, its idle or absolute expiry and the token's revocation end it at once. Every form
carries a CSRF token (an HMAC under the session's own secret, so any web process accepts it; without auth,
a per-process secret), and a write whose Sec-Fetch-Site says another site sent it is refused. Each action
form carries a fresh Idempotency-Key and the revision it was rendered with: a double submit replays, a
stale page answers with a conflict banner and the new row.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from taskq.actors.declaration import default_registry
from taskq.exceptions import ConfigurationError, DatabaseUnavailable, TokenRevoked
from taskq.models import JobStatus, QueueLimits
from taskq.ops.queues import check_queue_name
from taskq.ops.tokens import Principal, authenticate
from taskq.web import actions, reads, sessions
from taskq.web.actions import BULK_LIMIT, Caller, Outcome
from taskq.web.api import _KEY as IDEMPOTENCY_KEY
from taskq.web.api import UNAVAILABLE_TEXT, state_of
from taskq.web.bodies import MAX_REVISION
from taskq.web.guard import read_form
from taskq.web.problems import Problem, forbidden
from taskq.web.svg import Node, graph, sparkline

COOKIE = "taskq_session"
ENV = Environment(loader=PackageLoader("taskq.web", "templates"), autoescape=select_autoescape(["html"]))
NAV = (("", "Overview"), ("/jobs", "Jobs"), ("/cancellations", "Cancellations"), ("/workers", "Workers"),
       ("/schedules", "Schedules"))


def _age(value: Any) -> str:
    if not isinstance(value, datetime):
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    if seconds < 0:
        return f"in {-seconds:.0f}s"
    if seconds < 120:
        return f"{seconds:.1f}s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"


def _when(value: Any) -> str:
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.strftime("%Y-%m-%d %H:%M:%S") if isinstance(value, datetime) else ""


ENV.filters["age"] = _age
ENV.filters["when"] = _when


def base_of(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


SESSION_SCOPE = "taskq.session"


def csrf_token(request: Request) -> str:
    """The CSRF token of the request's session ("" without one); without auth, under the process's secret."""
    st = state_of(request)
    if not st.config.auth:
        return hmac.new(st.secret, b"anonymous", hashlib.sha256).hexdigest()[:40]
    session: sessions.Session | None = request.scope.get(SESSION_SCOPE)
    return sessions.csrf_token(session) if session is not None else ""


async def principal_of(request: Request) -> Principal | None:
    """The principal of the request's dashboard session (resolved in the database, kept in the request's
    scope for its CSRF check), `anonymous` without auth, None without a live session."""
    st = state_of(request)
    if not st.config.auth:
        return await st.principal(None)
    session = await st.session(request.cookies.get(COOKIE))
    request.scope[SESSION_SCOPE] = session
    return session.principal if session is not None else None


def _secure(request: Request) -> bool:
    forced = state_of(request).config.secure_cookies
    if forced is not None:
        return forced
    if request.url.scheme == "https":
        return True
    server = request.scope.get("server")
    host = str(server[0]) if server else ""
    try:
        return not (host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback)
    except ValueError:
        return True


def render(request: Request, template: str, who: Principal | None, status: int = 200, **context: Any) -> HTMLResponse:
    base = base_of(request)
    html = ENV.get_template(template).render(
        request=request, base=base, who=who, nav=NAV, path=request.url.path.removeprefix(base) or "",
        csrf=csrf_token(request), new_key=uuid.uuid4().hex,
        poll=state_of(request).config.poll_seconds, auth=state_of(request).config.auth, **context)
    return HTMLResponse(html, status_code=status, headers={"Cache-Control": "no-store"})


Page = Callable[[Request, Principal], Awaitable[Response]]


def page(fn: Page) -> Callable[[Request], Awaitable[Response]]:
    """A logged-in page: no session goes to the login page; a Problem renders as an error page."""

    async def wrapped(request: Request) -> Response:
        try:
            who = await principal_of(request)
        except DatabaseUnavailable:  # its text names the server: never shown to a client
            return render(request, "error.html", None, status=503, status_code=503, message=UNAVAILABLE_TEXT)
        if who is None:
            return RedirectResponse(f"{base_of(request)}/login?{urlencode({'next': request.url.path})}", 303)
        request.scope["taskq.principal"] = who.name  # for the access log
        try:
            if request.method == "POST":
                await check_csrf(request)
            return await fn(request, who)
        except Problem as p:
            return render(request, "error.html", who, status=p.status, status_code=p.status, message=p.detail)
        except (ConfigurationError, ValueError) as exc:
            return render(request, "error.html", who, status=400, status_code=400, message=str(exc))
        except DatabaseUnavailable:
            return render(request, "error.html", who, status=503, status_code=503, message=UNAVAILABLE_TEXT)
        except TokenRevoked:  # revoked while this page's write ran: the write rolled back
            return RedirectResponse(f"{base_of(request)}/login?{urlencode({'next': request.url.path})}", 303)

    wrapped.__name__ = fn.__name__
    return wrapped


async def check_csrf(request: Request) -> None:
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise Problem(403, "PERMISSION_DENIED", "cross-site form posts are refused")
    form = await read_form(request)
    request.scope["taskq.form"] = form
    sent = str(form.get("csrf", ""))
    expected = csrf_token(request)
    if not expected or not hmac.compare_digest(sent, expected):
        raise Problem(403, "PERMISSION_DENIED", "the form's CSRF token is missing or stale: reload the page")


def form_of(request: Request) -> FormData:
    form: FormData = request.scope["taskq.form"]
    return form


def caller_of(request: Request, who: Principal) -> Caller:
    raw = str(form_of(request).get("idempotency_key", "")).strip()
    if not raw:
        return Caller(who, uuid.uuid4().hex, None)
    match = IDEMPOTENCY_KEY.match(raw)
    if match is None:
        raise Problem(400, "INVALID_ARGUMENT", "idempotency_key must be 1-255 visible ASCII characters")
    return Caller(who, uuid.uuid4().hex, match.group(1))


# -- login ----------------------------------------------------------------------------------------------

async def login(request: Request) -> Response:
    st = state_of(request)
    if not st.config.auth:
        return RedirectResponse(f"{base_of(request)}/", 303)
    nxt = request.query_params.get("next", "/")
    if not nxt.startswith("/") or nxt.startswith("//"):
        nxt = "/"
    if request.method == "GET":
        return render(request, "login.html", None, next=nxt, error=None)
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return render(request, "login.html", None, status=403, next=nxt, error="cross-site login refused")
    form = await read_form(request)
    token = str(form.get("token", "")).strip()
    try:
        who = await authenticate(await st.backend(), token) if token else None
    except DatabaseUnavailable:  # its text names the server: never shown to a client
        return render(request, "error.html", None, status=503, status_code=503, message=UNAVAILABLE_TEXT)
    if who is None:
        return render(request, "login.html", None, status=401, next=nxt, error="unknown or revoked token")
    backend = await st.backend()
    await sessions.prune(backend)
    session_id, _ = await sessions.create(backend, who, idle_seconds=st.config.session_idle_seconds,
                                          absolute_seconds=st.config.session_max_seconds)
    response = RedirectResponse(f"{base_of(request)}{nxt}", 303)
    response.set_cookie(COOKIE, session_id, max_age=int(st.config.session_max_seconds), httponly=True,
                        samesite="strict", secure=_secure(request), path=(base_of(request) or "/"))
    return response


async def logout(request: Request) -> Response:
    """End the session in the database (its cookie is refused from now on, wherever it is sent) and drop
    the cookie."""
    st = state_of(request)
    session_id = request.cookies.get(COOKIE)
    if st.config.auth and session_id:
        await sessions.end(await st.backend(), session_id)
    response = RedirectResponse(f"{base_of(request)}/login", 303)
    response.delete_cookie(COOKIE, path=(base_of(request) or "/"), httponly=True, samesite="strict",
                           secure=_secure(request))
    return response


# -- pages ----------------------------------------------------------------------------------------------

@page
async def overview(request: Request, who: Principal) -> Response:
    st = state_of(request)
    key = f"stats:{who.name}"
    stats = st.cached(key) or st.remember(key, await reads.stats(await st.backend(), who, state=st))
    queues = []
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    minutes = [now - timedelta(minutes=stats["window_minutes"] - 1 - i) for i in range(stats["window_minutes"])]
    for name, q in sorted(stats["queues"].items()):
        done = [p for p in q["per_minute"] if p["status"] == "succeeded"]
        per_minute = {datetime.fromisoformat(p["minute"]): p["n"] for p in done}
        p95s = {datetime.fromisoformat(p["minute"]): p["run_p95"] or 0.0 for p in done}
        queues.append({"name": name, **q, "chart": sparkline([per_minute.get(m, 0) for m in minutes]),
                       "latency_chart": sparkline([p95s.get(m, 0.0) for m in minutes]),
                       "limits_text": QueueLimits(**q["limits"]).describe() if q["limits"] is not None else None,
                       "writable": who.may("queues:write", name),
                       "p95": max((p["run_p95"] or 0 for p in done), default=None)})
    cancelling = await reads.cancellations(await st.backend(), who, limit=1000) if who.may("jobs:read") else []
    return render(request, "overview.html", who, queues=queues, statuses=list(JobStatus),
                  cancelling=len(cancelling), window=stats["window_minutes"])


def _filters_of(request: Request) -> dict[str, str]:
    return {k: v for k, v in request.query_params.items() if k in reads.JOB_FILTERS and v}


@page
async def jobs(request: Request, who: Principal) -> Response:
    query = {k: [v] for k, v in request.query_params.items() if v and k != "msg"}
    result = await reads.job_page(await state_of(request).backend(), who, query)
    filters = _filters_of(request)
    next_url = None
    if result.next_after is not None:
        next_url = "?" + urlencode(filters | {"cursor": reads.encode_cursor(result.next_after),
                                              "limit": str(reads.page_limit(query))})
    return render(request, "jobs.html", who, jobs=result.rows, filters=filters, next_url=next_url,
                  statuses=list(JobStatus), bulk_limit=BULK_LIMIT, message=request.query_params.get("msg"))


@page
async def job(request: Request, who: Principal) -> Response:
    st = state_of(request)
    detail = await reads.job_detail(await st.backend(), who, reads.job_id_of(request.path_params["job_id"]))
    return render(request, "job.html", who, d=detail, j=detail["job"], message=request.query_params.get("msg"),
                  conflict=None)


@page
async def workflow(request: Request, who: Principal) -> Response:
    """A workflow's page: its members drawn as a graph (server-rendered SVG, each node linking to its job),
    their counts by status, and the workflow's cancel button."""
    workflow_id = reads.workflow_id_of(request.path_params["workflow_id"])
    found = await reads.workflow(await state_of(request).backend(), who, workflow_id)
    base = base_of(request)
    nodes = [Node(str(r.id), r.actor, str(r.status), f"{base}/jobs/{r.id}") for r in found["members"]]
    chart = graph(nodes, [(str(a), str(b)) for a, b in found["edges"]])
    return render(request, "workflow.html", who, w=found, chart=chart, message=request.query_params.get("msg"))


@page
async def workflow_cancel(request: Request, who: Principal) -> Response:
    """The workflow page's cancel button, through the API's action (jobs:cancel on every member's queue,
    idempotency, audit)."""
    workflow_id = reads.workflow_id_of(request.path_params["workflow_id"])
    reason = str(form_of(request).get("reason", "")).strip() or None
    fp = actions.fingerprint("POST", f"/api/v1/workflows/{workflow_id}:cancel", {"reason": reason})
    outcome = await actions.cancel_workflow(await state_of(request).backend(), caller_of(request, who), workflow_id,
                                            reason=reason, request_fingerprint=fp)
    b = outcome.body
    msg = (f"cancelled {b['cancelled']} waiting, asked {b['cancel_requested']} running to stop, "
           f"{b['already_ended']} had ended" + (" (replayed: this form was already sent)" if outcome.replayed else ""))
    return RedirectResponse(f"{base_of(request)}/workflows/{workflow_id}?" + urlencode({"msg": msg}), 303)


@page
async def workers(request: Request, who: Principal) -> Response:
    return render(request, "workers.html", who, workers=await reads.workers(await state_of(request).backend(), who))


@page
async def schedules(request: Request, who: Principal) -> Response:
    return render(request, "schedules.html", who,
                  schedules=await reads.schedules(await state_of(request).backend(), who),
                  message=request.query_params.get("msg"))


@page
async def cancellations(request: Request, who: Principal) -> Response:
    st = state_of(request)
    backend = await st.backend()
    rows = await reads.cancellations(backend, who)
    ladders = await reads.cancel_ladders(backend, rows, st.config.cancellation_grace_period,
                                         st.config.cleanup_grace_period)
    by_phase: dict[int, list[tuple[Any, Any]]] = {1: [], 2: []}
    for r, lad in zip(rows, ladders, strict=True):
        by_phase.setdefault(r.cancel_phase, []).append((r, lad))
    return render(request, "cancellations.html", who, by_phase=by_phase, total=len(rows))


# -- writes ---------------------------------------------------------------------------------------------

def _revision(form: FormData) -> int | None:
    raw = str(form.get("expected_revision", "")).strip()
    if not raw:
        return None
    if not raw.isdigit() or len(raw) > 19 or not 1 <= int(raw) <= MAX_REVISION:
        raise Problem(400, "INVALID_ARGUMENT", f"expected_revision must be a job revision, got {raw[:20]!r}")
    return int(raw)


@page
async def job_action(request: Request, who: Principal) -> Response:
    st = state_of(request)
    form = form_of(request)
    job_id = reads.job_id_of(request.path_params["job_id"])
    verb = request.path_params["verb"]
    reason = str(form.get("reason", "")).strip() or None
    body = {"reason": reason, "expected_revision": _revision(form)}
    fp = actions.fingerprint("POST", f"/api/v1/jobs/{job_id}:{verb}", body)
    backend = await st.backend()
    if verb == "cancel":
        outcome = await actions.cancel(backend, caller_of(request, who), job_id, reason=reason,
                                       expected_revision=_revision(form), request_fingerprint=fp)
    elif verb == "requeue":
        outcome = await actions.requeue(backend, caller_of(request, who), job_id, reason=reason, attempts=None,
                                        expected_revision=_revision(form),
                                        registry=st.config.registry or default_registry, request_fingerprint=fp)
    else:
        raise Problem(404, "NOT_FOUND", f"no action {verb!r}")
    if outcome.status == 409:
        if "queue" not in outcome.body["job"]:  # the row is not the caller's to read
            return render(request, "error.html", who, status=409, status_code=409,
                          message=f"conflict: {outcome.body['detail']}")
        detail = await reads.job_detail(backend, who, job_id)
        return render(request, "job.html", who, status=409, d=detail, j=detail["job"], message=None,
                      conflict=outcome.body["detail"])
    return RedirectResponse(f"{base_of(request)}/jobs/{job_id}?" + urlencode({"msg": _said(verb, outcome)}), 303)


def _said(verb: str, outcome: Outcome) -> str:
    replay = " (replayed: this form was already sent)" if outcome.replayed else ""
    if verb == "cancel":
        text = ("cancel requested: the worker is told (202, not stopped yet)" if outcome.status == 202
                else "cancelled")
    else:
        text = "requeued"
    return text + replay


@page
async def bulk(request: Request, who: Principal) -> Response:
    """A bulk cancel or requeue by the list's filters: the first post shows what matches and asks to
    confirm; the confirmed post acts on at most `limit` jobs."""
    st = state_of(request)
    form = form_of(request)
    verb = str(form.get("verb", ""))
    if verb not in ("cancel", "requeue"):
        raise Problem(400, "INVALID_ARGUMENT", "verb must be cancel or requeue")
    filters = {k: str(form.get(k, "")) for k in reads.JOB_FILTERS if k != "parent" and form.get(k)}
    query = {k: [v] for k, v in filters.items()}
    flt = reads.as_job_filter(reads.parse_filter(query))
    if flt.is_empty:
        raise Problem(400, "INVALID_ARGUMENT", "set a filter before a bulk action (a status, queue, actor or tag)")
    limit = min(BULK_LIMIT, max(1, int(str(form.get("limit", "100")) or 100)))
    reason = str(form.get("reason", "")).strip() or None
    backend = await st.backend()
    if form.get("confirm") != "yes":
        preview = await reads.job_page(backend, who, query | {"limit": [str(min(limit, reads.MAX_PAGE))]},
                                       action=f"jobs:{verb}")
        return render(request, "confirm.html", who, verb=verb, filters=filters, limit=limit, reason=reason,
                      preview=preview.rows, more=preview.next_after is not None)
    body = {"filter": filters, "limit": limit, "reason": reason}
    fp = actions.fingerprint("POST", f"/api/v1/jobs:{verb}", body)
    if verb == "cancel":
        outcome = await actions.bulk_cancel(backend, caller_of(request, who), flt, reason=reason, limit=limit,
                                            request_fingerprint=fp)
    else:
        outcome = await actions.bulk_requeue(backend, caller_of(request, who), flt, reason=reason, attempts=None,
                                             limit=limit, registry=st.config.registry or default_registry,
                                             request_fingerprint=fp)
    b = outcome.body
    msg = f"{verb}: {len(b['job_ids'])} of {b['matched']} matched" + (" (more match: run it again)" if b["more"]
                                                                       else "")
    return RedirectResponse(f"{base_of(request)}/jobs?" + urlencode(filters | {"msg": msg}), 303)


@page
async def schedule_action(request: Request, who: Principal) -> Response:
    name = request.path_params["name"]
    verb = request.path_params["verb"]
    if verb not in ("pause", "resume", "trigger"):
        raise Problem(404, "NOT_FOUND", f"no action {verb!r}")
    fp = actions.fingerprint("POST", f"/api/v1/schedules/{name}:{verb}", {})
    outcome = await actions.schedule_action(await state_of(request).backend(), caller_of(request, who), name, verb,
                                            request_fingerprint=fp)
    said = {"pause": "paused", "resume": "resumed", "trigger": "triggered"}[verb]
    msg = f"{name}: {said}" + (f" (job {outcome.body['job_id']})" if verb == "trigger" else "")
    return RedirectResponse(f"{base_of(request)}/schedules?" + urlencode({"msg": msg}), 303)


@page
async def queue_action(request: Request, who: Principal) -> Response:
    name = request.path_params["name"]
    verb = request.path_params["verb"]
    if verb not in ("pause", "resume"):
        raise Problem(404, "NOT_FOUND", f"no action {verb!r}")
    fp = actions.fingerprint("POST", f"/api/v1/queues/{name}:{verb}", {})
    st = state_of(request)
    outcome = await actions.queue_action(await st.backend(), caller_of(request, who), check_queue_name(name), verb,
                                         reason=None, request_fingerprint=fp)
    st.forget()
    said = {"pause": "paused", "resume": "resumed"}[verb] if outcome.body["changed"] else f"already {verb}d"
    return RedirectResponse(f"{base_of(request)}/?" + urlencode({"msg": f"queue {name}: {said}"}), 303)


LIMIT_INPUTS = {"concurrency": int, "concurrency_per_key": int, "rate_limit": int, "rate_period": float}


def _limit_change(form: FormData) -> tuple[dict[str, Any], dict[str, str]]:
    """The limits a form sets: an empty field keeps its limit, `none` removes it, anything else is a
    number (checked again by taskq.ops.queues, as for the API)."""
    change: dict[str, Any] = {}
    raw: dict[str, str] = {}
    for field, kind in LIMIT_INPUTS.items():
        text = str(form.get(field, "")).strip()
        if not text:
            continue
        raw[field] = text
        if text.lower() == "none":
            change[field] = None
            continue
        try:
            change[field] = kind(text)
        except ValueError:
            raise Problem(400, "INVALID_ARGUMENT", f"{field} must be a number or none, got {text!r}") from None
    return change, raw


async def _queue_limits_of(request: Request, who: Principal, name: str) -> QueueLimits:
    return await reads.queue_limits(await state_of(request).backend(), who, name)


@page
async def queue_limits(request: Request, who: Principal) -> Response:
    """The form that sets a queue's limits (its post asks to confirm first)."""
    name = check_queue_name(request.path_params["name"])
    current = await _queue_limits_of(request, who, name)
    return render(request, "queue_limit.html", who, name=name, current_text=current.describe(), change=None, raw={})


@page
async def queue_limit(request: Request, who: Principal) -> Response:
    """The limit form's post: first a confirmation of the change, then (confirm=yes) the change itself,
    through the API's action (queues:write, idempotency, audit)."""
    name = check_queue_name(request.path_params["name"])
    form = form_of(request)
    change, raw = _limit_change(form)
    reason = str(form.get("reason", "")).strip() or None
    if not who.may("queues:write", name):
        raise forbidden("queues:write", name)
    if not change:
        raise Problem(400, "INVALID_ARGUMENT", "set or remove at least one limit")
    if form.get("confirm") != "yes":
        current = await _queue_limits_of(request, who, name)
        return render(request, "queue_limit.html", who, name=name, current_text=current.describe(), change=change,
                      raw=raw | ({"reason": reason} if reason else {}))
    fp = actions.fingerprint("POST", f"/api/v1/queues/{name}:limit", change | {"reason": reason})
    st = state_of(request)
    outcome = await actions.queue_limit(await st.backend(), caller_of(request, who), name, change, reason=reason,
                                        request_fingerprint=fp)
    st.forget()
    msg = f"queue {name}: limits now {QueueLimits(**outcome.body['limits']).describe()}"
    return RedirectResponse(f"{base_of(request)}/?" + urlencode({"msg": msg}), 303)


@page
async def queue(request: Request, who: Principal) -> Response:
    """A queue's page: its limits and fair share (the weights, and per key: ready, scheduled, running, started
    in the last minute, weight), with the form that sets a key's weight."""
    name = check_queue_name(request.path_params["name"])
    backend = await state_of(request).backend()
    limits = await reads.queue_limits(backend, who, name)
    keys = await reads.queue_keys(backend, who, name)
    return render(request, "queue.html", who, name=name, limits_text=limits.describe(), keys=keys["keys"],
                  weights=keys["weights"], writable=who.may("queues:write", name),
                  message=request.query_params.get("msg"))


@page
async def queue_weight(request: Request, who: Principal) -> Response:
    """The weight form's post, through the API's action (queues:write, idempotency, audit): KEY empty is the
    jobs enqueued without a key."""
    name = check_queue_name(request.path_params["name"])
    form = form_of(request)
    key = str(form.get("key", ""))
    text = str(form.get("weight", "")).strip()
    try:
        weight = float(text)
    except ValueError:
        raise Problem(400, "INVALID_ARGUMENT", f"weight must be a number greater than 0, got {text[:80]!r}") from None
    reason = str(form.get("reason", "")).strip() or None
    fp = actions.fingerprint("PUT", f"/api/v1/queues/{name}/fairness-weights/{reads.key_segment(key)}",
                             {"weight": weight, "reason": reason})
    st = state_of(request)
    outcome = await actions.queue_weight(await st.backend(), caller_of(request, who), name,
                                         reads.fairness_key_of(reads.key_segment(key)), weight, reason=reason,
                                         request_fingerprint=fp)
    st.forget()
    msg = f"weight of {key or '(no key)'}: {outcome.body['weight']:g}"
    return RedirectResponse(f"{base_of(request)}/queues/{quote(name, safe='')}?" + urlencode({"msg": msg}), 303)


def routes() -> list[BaseRoute]:
    return [
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", overview, methods=["GET"]),
        Route("/jobs", jobs, methods=["GET"]),
        Route("/jobs/bulk", bulk, methods=["POST"]),
        Route("/jobs/{job_id}", job, methods=["GET"]),
        Route("/jobs/{job_id}/{verb}", job_action, methods=["POST"]),
        Route("/workflows/{workflow_id}", workflow, methods=["GET"]),
        Route("/workflows/{workflow_id}/cancel", workflow_cancel, methods=["POST"]),
        Route("/workers", workers, methods=["GET"]),
        Route("/schedules", schedules, methods=["GET"]),
        Route("/schedules/{name}/{verb}", schedule_action, methods=["POST"]),
        Route("/queues/{name}", queue, methods=["GET"]),
        Route("/queues/{name}/weight", queue_weight, methods=["POST"]),
        Route("/queues/{name}/limits", queue_limits, methods=["GET"]),
        Route("/queues/{name}/limit", queue_limit, methods=["POST"]),
        Route("/queues/{name}/{verb}", queue_action, methods=["POST"]),
        Route("/cancellations", cancellations, methods=["GET"]),
    ]
