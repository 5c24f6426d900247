"""The OpenAPI 3.1 description of /api/v1, served at /api/v1/openapi.json (built from the same body
models and JobRow the handlers use; a test checks that every route is described)."""

from __future__ import annotations

import functools
from typing import Any

from taskq.models import JobRow
from taskq.web.bodies import (
    BulkBody,
    CancelBody,
    EnqueueBody,
    LimitBody,
    QueueBody,
    RequeueBody,
    SignalBody,
    WeightBody,
    WorkflowCancelBody,
)

_REF = "#/components/schemas/{model}"


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema or {"type": "object"}}}}


_ERRORS = {"400": _problem("INVALID_ARGUMENT"), "401": _problem("UNAUTHENTICATED"),
           "403": _problem("PERMISSION_DENIED"), "404": _problem("NOT_FOUND")}
_WRITE_ERRORS = _ERRORS | {"409": _problem("STATE_CONFLICT (with the current row as `job`); UNIQUE_KEY_HELD on an "
                                           "enqueue"),
                           "413": _problem("TOO_LARGE"), "422": _problem("IDEMPOTENCY_KEY_REUSED")}
_KEY = {"name": "Idempotency-Key", "in": "header", "required": False, "schema": {"type": "string", "maxLength": 255},
        "description": "A replay with the same key and request returns the first status and body "
        "(header Idempotent-Replayed: true); the same key with another request answers 422."}
_IF_MATCH = {"name": "If-Match", "in": "header", "required": False, "schema": {"type": "string"},
             "description": "The expected revision, as expected_revision in the body."}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}


def _body(model: str) -> dict[str, Any]:
    return {"required": False, "content": {"application/json": {"schema": {"$ref": _REF.format(model=model)}}}}


def _page_params() -> list[dict[str, Any]]:
    return [{"name": "limit", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "1-500 (default 50)"},
            {"name": "cursor", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "next_cursor of the last page"}]


def _filters() -> list[dict[str, Any]]:
    names = {"status": "comma-separated statuses", "queue": "queue names", "actor": "actor names",
             "tag": "tags (all must be present)", "parent": "parent job id", "created_after": "ISO 8601",
             "created_before": "ISO 8601", "workflow_id": "the members of this workflow",
             "waiting": "sleep | signal | any: jobs suspended by ctx.sleep, ctx.wait_for_signal, or either",
             "limit": "1-500 (default 50)", "cursor": "next_cursor of the last page"}
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}, "description": d}
            for n, d in names.items()]


@functools.cache
def schema() -> dict[str, Any]:
    job = {"$ref": _REF.format(model="JobRow")}
    job_answer = {"type": "object", "properties": {"job": job, "previous_status": {"type": "string"}}}
    minimal = {"type": "object", "required": ["id", "status", "revision"],
               "description": "the job as a token without jobs:read on its queue sees it",
               "properties": {"id": {"type": "string", "format": "uuid"}, "status": {"type": "string"},
                              "revision": {"type": "integer"}}}
    acted = {"type": "object", "description": "`job` is the whole row with jobs:read on the job's queue, else only "
             "{id, status, revision} (also in a 409's `job`)",
             "properties": {"job": {"oneOf": [job, minimal]}, "previous_status": {"type": "string"}}}
    more = {"type": "object", "description": "true where older rows than the newest 100 exist (page through them "
            "with /jobs/{job_id}/events and /audit)",
            "properties": {k: {"type": "boolean"} for k in ("events", "attempts", "audit")}}
    models = {m.__name__: m.model_json_schema(ref_template=_REF)
              for m in (JobRow, CancelBody, RequeueBody, EnqueueBody, BulkBody, QueueBody, LimitBody, WeightBody,
                        SignalBody, WorkflowCancelBody)}
    components: dict[str, Any] = {}
    for name, s in models.items():
        components.update(s.pop("$defs", {}))
        components[name] = s
    components["Problem"] = {
        "type": "object", "required": ["type", "title", "status", "code", "detail"],
        "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                       "code": {"type": "string"}, "detail": {"type": "string"}, "instance": {"type": "string"},
                       "request_id": {"type": "string"}, "job": job}}
    read = {"security": [{"bearer": []}], "responses": {"200": _json("OK")} | _ERRORS}

    def write(op: str, summary: str, body: str | None, ok: dict[str, Any], params: list[Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"operationId": op, "summary": summary, "security": [{"bearer": []}],
                               "parameters": [*params, _KEY], "responses": ok | _WRITE_ERRORS}
        if body:
            out["requestBody"] = _body(body)
        return out

    paths: dict[str, Any] = {
        "/jobs": {
            "get": read | {"operationId": "listJobs", "summary": "jobs, newest first, keyset pages",
                           "parameters": _filters()},
            "post": write("enqueueJob", "enqueue a job", "EnqueueBody",
                          {"201": _json("enqueued", job_answer),
                           "200": _json("its unique key is held by a job of a queue the token may read: that job",
                                        job_answer)}, [])
            | {"description": "Unique keys are one namespace across all queues. A key held by a job of a queue "
               "the token may not read (jobs:read) answers 409 UNIQUE_KEY_HELD, with no row, id or queue."},
        },
        "/jobs/{job_id}": {"get": read | {
            "operationId": "getJob", "parameters": [_JOB_ID],
            "summary": "row (with revision), the newest 100 events, attempts and audit rows (`more` says where "
                       "older ones exist), parents, children",
            "responses": {"200": _json("the detail", {"type": "object", "properties": {"job": job, "more": more}})}
            | _ERRORS}},
        "/jobs/{job_id}/events": {"get": read | {
            "operationId": "listJobEvents", "parameters": [_JOB_ID, *_page_params()],
            "summary": "the job's timeline, newest first, keyset pages (`events`, `next_cursor`)"}},
        "/jobs/{job_id}/audit": {"get": read | {
            "operationId": "listJobAudit", "parameters": [_JOB_ID, *_page_params()],
            "summary": "the job's audit rows, newest first, keyset pages (`audit`, `next_cursor`)"}},
        "/jobs/{job_id}:cancel": {"post": write(
            "cancelJob", "cancel one job", "CancelBody",
            {"200": _json("it was pending or scheduled: cancelled", acted),
             "202": _json("it is running: the request is durably stored (cancel_phase 1), not 'stopped'",
                          acted)}, [_JOB_ID, _IF_MATCH])},
        "/jobs/{job_id}:requeue": {"post": write("requeueJob", "requeue a failed, crashed or abandoned job",
                                                 "RequeueBody", {"200": _json("requeued", acted)},
                                                 [_JOB_ID, _IF_MATCH])},
        "/jobs/{job_id}:signal": {"post": write(
            "signalJob", "send a signal to the job (jobs:signal on its queue): kept until a "
            "ctx.wait_for_signal(name) of the job takes it; 409 when the job has ended", "SignalBody",
            {"200": _json("stored: `signal_id`, `woke` (the job was waiting for it and is due now)", acted)},
            [_JOB_ID])},
        "/workflows/{workflow_id}:cancel": {"post": write(
            "cancelWorkflow", "cancel every unfinished member of a workflow (jobs:cancel on every queue it uses)",
            "WorkflowCancelBody",
            {"200": _json("counts: cancelled (were waiting), suspended (of those, sleeping or waiting for a "
                          "signal), cancel_requested (running: asked to stop), already_cancelling, already_ended, "
                          "members; job_ids changed")},
            [{"name": "workflow_id", "in": "path", "required": True,
              "schema": {"type": "string", "format": "uuid"}}])},
        "/jobs:cancel": {"post": write("bulkCancel", "cancel at most `limit` matching jobs", "BulkBody",
                                       {"200": _json("counts by previous status, `more`")}, [])},
        "/jobs:requeue": {"post": write("bulkRequeue", "requeue at most `limit` matching jobs", "BulkBody",
                                        {"200": _json("counts by previous status, `conflicts` (job id -> the "
                                                      "holder of its unique key, null when unreadable), `more`")},
                                        [])},
        "/workers": {"get": read | {"operationId": "listWorkers"}},
        "/schedules": {"get": read | {"operationId": "listSchedules"}},
        "/queues": {"get": read | {"operationId": "listQueues", "summary": "depth, paused and limits per queue"}},
        "/stats": {"get": read | {"operationId": "getStats", "summary": "depth by status, last hour per minute"}},
        "/cancellations": {"get": read | {"operationId": "listCancellations", "summary": "cancels in flight"}},
    }
    for verb in ("pause", "resume", "trigger"):
        paths[f"/schedules/{{name}}:{verb}"] = {"post": write(f"{verb}Schedule", f"{verb} a schedule", None,
                                                              {"200": _json("done")}, [_NAME])}
    queue_state = {"type": "object", "required": ["name", "paused", "changed"],
                   "properties": {"name": {"type": "string"}, "paused": {"type": "boolean"},
                                  "changed": {"type": "boolean", "description": "false: it already was so"}}}
    for verb in ("pause", "resume"):
        paths[f"/queues/{{name}}:{verb}"] = {"post": write(
            f"{verb}Queue", f"{verb} a queue fleet-wide (queues:write on it); 404 for an unknown queue",
            "QueueBody", {"200": _json("the queue's state", queue_state)}, [_NAME])}
    limits = {"type": "object", "required": ["name", "limits"],
              "properties": {"name": {"type": "string"}, "limits": {"type": "object", "properties": {
                  k: {"type": ["integer", "null"]} for k in ("concurrency", "concurrency_per_key", "rate_limit")}
                  | {"rate_period": {"type": ["number", "null"]}}}}}
    paths["/queues/{name}:limit"] = {"post": write(
        "limitQueue", "set (a value) or remove (null) a queue's fleet-wide limits; a limit left out is kept "
        "(queues:write on it); creates the queue's row if it has none", "LimitBody",
        {"200": _json("the queue's limits after the change", limits)}, [_NAME])}
    key_param = {"name": "key", "in": "path", "required": True, "schema": {"type": "string"},
                 "description": "the fairness key, percent-encoded; `~empty` is the jobs enqueued without a key, "
                 "and a key that starts with `~` is written with one more (`~~x` is the key `~x`)"}
    weight = {"type": "object", "required": ["queue", "key", "weight", "previous", "retagged"],
              "properties": {"queue": {"type": "string"}, "key": {"type": "string", "description": "'' for the "
                                                                   "jobs without a key"},
                             "weight": {"type": "number"}, "previous": {"type": "number"},
                             "retagged": {"type": "integer", "description": "the key's ready jobs re-spaced by the "
                                          "new weight"}}}
    paths["/queues/{name}/fairness-weights/{key}"] = {"put": write(
        "setFairnessWeight", "set a fairness key's weight in a queue (queues:write on it; 1 is the default); 404 "
        "for an unknown queue", "WeightBody", {"200": _json("the weight before and now", weight)}, [_NAME, key_param])}
    key_row = {"type": "object", "properties": {
        "key": {"type": "string"}, "ready": {"type": "integer"}, "scheduled": {"type": "integer"},
        "running": {"type": "integer"}, "started_last_minute": {"type": "integer"}, "weight": {"type": "number"}}}
    paths["/queues/{name}/keys"] = {"get": read | {
        "operationId": "listQueueKeys", "parameters": [_NAME],
        "summary": "per fairness key of the queue: ready, scheduled, running, started in the last minute, weight "
                   "(queues:read on it); the key '' is the jobs without a key",
        "responses": {"200": _json("the keys", {"type": "object", "properties": {
            "queue": {"type": "string"}, "keys": {"type": "array", "items": key_row},
            "weights": {"type": "object", "additionalProperties": {"type": "number"}},
            "empty_key": {"type": "string", "description": "how the empty key is spelled in a path"}}})}
        | _ERRORS}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "taskq operator API", "version": "1"},
        "servers": [{"url": "/api/v1"}],
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
