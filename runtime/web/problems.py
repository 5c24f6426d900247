"""The one error shape of the web API (RFC 9457 problem+json), framework-free: raised by the actions
and the request parsing, rendered by taskq.web.api."""

from __future__ import annotations

from typing import Any

PROBLEM_TYPE = "application/problem+json"

TITLES = {
    400: "Bad request",
    401: "Authentication required",
    403: "Permission denied",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request too large",
    415: "Unsupported media type",
    422: "Unprocessable request",
    500: "Internal error",
    503: "Database unavailable",
}


class Problem(Exception):
    """An error answer: HTTP status, a stable code (INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED,
    NOT_FOUND, STATE_CONFLICT, IDEMPOTENCY_KEY_REUSED, ...), a human detail and extra members (`job`).

    Not in taskq.exceptions and not a TaskqError, on purpose: it is the web app's answer, raised and
    rendered inside taskq.web (an optional integration the core never imports) and never seen by a
    caller of taskq; `taskq.web.api.endpoint` turns the TaskqErrors of the core into Problems."""

    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra

    def body(self, *, instance: str | None = None, request_id: str | None = None) -> dict[str, Any]:
        return problem_body(self.status, self.code, self.detail, instance=instance, request_id=request_id,
                            **self.extra)


def problem_body(
    status: int, code: str, detail: str, *, instance: str | None = None, request_id: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": f"urn:taskq:problem:{code.lower().replace('_', '-')}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "code": code,
        "detail": detail,
    }
    if instance is not None:
        body["instance"] = instance
    if request_id is not None:
        body["request_id"] = request_id
    body.update(extra)
    return body


def bad_request(detail: str, **extra: Any) -> Problem:
    return Problem(400, "INVALID_ARGUMENT", detail, **extra)


def forbidden(action: str, queue: str | None) -> Problem:
    where = f" on queue {queue!r}" if queue is not None else ""
    return Problem(403, "PERMISSION_DENIED", f"this token has no grant for {action}{where}")


def not_found(what: str) -> Problem:
    return Problem(404, "NOT_FOUND", f"no {what}")
