"""How the `taskq` CLI shows things: aligned tables and detail views for people, JSON for scripts.

Pure formatting: takes models, returns text. Nothing here touches the database or the terminal.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, TypeAdapter

from taskq.models import (
    NO_TIMEOUT,
    BulkCancelResult,
    BulkRequeueResult,
    CancelResult,
    JobAttempt,
    JobEvent,
    JobRow,
    JobStatus,
    RequeueResult,
    WorkflowCancelResult,
)

MAX_CELL = 48
NONE = "-"

_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
_ESCAPED = {c: f"\\x{c:02x}" for c in _CONTROLS}
_ESCAPED_KEEP_NEWLINES = {c: e for c, e in _ESCAPED.items() if c != 0x0A}
_JSON_C1 = {c: f"\\u{c:04x}" for c in range(0x80, 0xA0)}


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` with every C0 and C1 control character (ESC, BEL, CSI...) and DEL shown as `\\xNN`, so names
    and messages written by anyone cannot drive the terminal (clear it, retitle it, hide or recolour
    text). `newlines`: keep line breaks (multi-line output)."""
    return text.translate(_ESCAPED_KEEP_NEWLINES if newlines else _ESCAPED)


def to_json(value: Any) -> str:
    """Models as indented JSON, the shape `model_dump(mode="json")` gives (UUIDs and times as strings)."""
    # json escapes C0 controls itself; C1 ones (CSI is one) pass through ensure_ascii=False
    return json.dumps(_plain(value), indent=2, ensure_ascii=False).translate(_JSON_C1)


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return TypeAdapter(type(value)).dump_python(value, mode="json")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def when(value: datetime | None, *, precise: bool = False) -> str:
    """A timestamp in UTC, to the second (or millisecond), or "-" for none."""
    if value is None:
        return NONE
    utc = value.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{utc.microsecond // 1000:03d}" if precise else text


def _cell(value: object, *, cut: bool = True) -> str:
    text = NONE if value is None or value == "" else " ".join(printable(str(value)).split())
    return text if not cut or len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart, sized to their widest cell; long cells are cut, except in
    the last column, which has room to run on."""
    last = len(headers) - 1
    cells = [[_cell(v, cut=i < last) for i, v in enumerate(row)] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    lines = [headers, *cells]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


JOB_COLUMNS = ("id", "actor", "queue", "status", "attempt", "requeues", "created (UTC)", "unique_key", "error_class")


def jobs_table(rows: Sequence[JobRow], *, limit: int) -> str:
    if not rows:
        return "no matching jobs"
    body = table(
        JOB_COLUMNS,
        [
            (r.id, r.actor, r.queue, r.status.value, _attempt_cell(r), r.requeue_count,
             when(r.created_at), r.unique_key, r.error_class)
            for r in rows
        ],
    )
    if len(rows) >= limit:
        body += f"\n(showing the newest {limit}; raise --limit or narrow the filters to see others)"
    return body


def _attempt_cell(row: JobRow) -> str:
    cell = f"{row.attempt}/{row.max_attempts}"
    if row.snooze_count:
        cell += f" ({row.snooze_count} snoozed)"
    return cell


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def _lease(row: JobRow) -> str:
    """A running job's own lock runs out lock_timeout after the claim; its worker's heartbeat keeps it held
    past that (the worker's lease, in taskq.workers), which is why the lock alone may be in the past."""
    if row.lock_expires_at is None:
        return NONE
    if row.status is not JobStatus.RUNNING:
        return when(row.lock_expires_at)
    return f"{when(row.lock_expires_at)} (lock from the claim), then for as long as its worker's heartbeat renews"


def job_detail(row: JobRow, events: Sequence[JobEvent], attempts: Sequence[JobAttempt], *,
               waiting: str | None = None) -> str:
    """One job as a person reads it: the row (with what a waiting job waits for), then its timeline, then
    its attempts."""
    error = NONE
    if row.error_class or row.error_message:
        error = ": ".join(p for p in (row.error_class, row.error_message) if p)
    cancel = NONE
    if row.cancel_requested_at is not None:
        cancel = f"requested {when(row.cancel_requested_at)} UTC, phase {row.cancel_phase}"
        if row.cancel_reason:
            cancel += f", reason: {row.cancel_reason}"
    fields: list[tuple[str, str]] = [
        ("job", str(row.id)),
        ("actor", row.actor),
        ("queue", row.queue),
        ("status", row.status.value + (f" ({waiting})" if waiting else "")),
        ("error", error),
        ("attempt", f"{row.attempt} of {row.max_attempts} (claim epoch {row.claim_epoch}, "
                    f"interrupted {row.interrupt_count} times, snoozed {row.snooze_count} times)"),
        ("idempotent", "yes" if row.idempotent else
                       "no (after a crash or lost lease it ends crashed, for an operator to requeue)"),
        ("priority", str(row.priority)),
        ("tags", ", ".join(row.tags) or NONE),
        ("unique key", f"{row.unique_key} (scope {row.unique_scope})" if row.unique_key else NONE),
        ("limit key", row.concurrency_key or NONE),  # concurrency_key, for per-key limits
        ("fair key", row.fairness_key or NONE),  # fairness_key: its share of the queue (docs/fairness.md)
        ("requeues", str(row.requeue_count)),
        ("created", when(row.created_at)),
        ("scheduled", when(row.scheduled_at)),
        ("started", when(row.started_at)),
        ("finished", when(row.finished_at)),
        ("deadline", when(row.schedule_to_close)),
        ("worker", row.worker_id or NONE),
        ("lease until", _lease(row)),
        ("cancel", cancel),
        ("parent", str(row.parent_id) if row.parent_id else NONE),
        ("payload", _compact(row.payload)),
        ("result", _compact(row.result)),
        ("progress", _compact(row.progress)),
    ]
    width = max(len(name) for name, _ in fields)
    lines = [f"{name.ljust(width)}  {printable(value)}" for name, value in fields]
    lines.append("(times in UTC)")
    lines.append("")
    lines.append(f"events ({len(events)})")
    if events:
        lines.append(_indent(table(
            ("at (UTC)", "kind", "change", "attempt", "worker", "detail"),
            [
                (when(e.at, precise=True), e.kind, _transition(e), e.attempt, e.worker_id,
                 _compact(e.detail) if e.detail else None)
                for e in events
            ],
        )))
    lines.append("")
    lines.append(f"attempts ({len(attempts)})")
    if attempts:
        lines.append(_indent(table(
            ("attempt", "epoch", "worker", "started (UTC)", "finished (UTC)", "outcome", "error_class"),
            [
                (a.attempt, a.claim_epoch, a.worker_id, when(a.started_at), when(a.finished_at), a.outcome,
                 a.error_class)
                for a in attempts
            ],
        )))
    return "\n".join(lines)


def suspension(row: JobRow) -> str | None:
    """What a suspended job waits for: 'sleeping until T', 'waiting for signal NAME until T' (or with no
    timeout); None for a job that is not suspended (wait_kind means something only while scheduled)."""
    found = row.suspension
    if found is None:
        return None
    until = "with no timeout" if found.until is None else f"until {when(found.until)} UTC"
    if found.kind == "sleep":
        return f"sleeping {until}"
    return f"waiting for signal {found.signal!r} {until}"


def durable_sections(steps: Sequence[Any], signals: Sequence[Any]) -> str:
    """`taskq job`: the steps, sleeps and waits its attempts stored, and the signals sent to it."""
    lines = [f"steps ({len(steps)})"]
    if steps:
        lines.append(_indent(table(
            ("stored (UTC)", "kind", "name", "attempt", "epoch", "result", "wakes (UTC)"),
            [(when(s.created_at, precise=True), s.kind, s.name, s.attempt, s.claim_epoch,
              _compact(s.result) if s.result is not None else None,
              None if s.wake_at is None else "never" if s.wake_at >= NO_TIMEOUT else when(s.wake_at))
             for s in steps],
        )))
    lines.append("")
    lines.append(f"signals ({len(signals)})")
    if signals:
        lines.append(_indent(table(
            ("sent (UTC)", "id", "name", "payload", "taken (UTC)", "by wait", "attempt"),
            [(when(g.sent_at, precise=True), g.id, g.name, _compact(g.payload),
              when(g.consumed_at, precise=True) if g.consumed_at else None, g.consumed_by, g.consumed_attempt)
             for g in signals],
        )))
    return printable("\n".join(lines), newlines=True)


def _transition(event: JobEvent) -> str | None:
    if event.from_status is None and event.to_status is None:
        return None
    return f"{event.from_status or '?'} -> {event.to_status or '?'}"


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def cancel_summary(result: CancelResult) -> str:
    """What one `taskq cancel ID` did, in words, with the raw fields on the first line."""
    head = (
        f"job {result.job_id}: {result.previous_status.value} -> {result.new_status.value}, "
        f"cancellation_initiated={str(result.cancellation_initiated).lower()}"
    )
    if result.cancellation_initiated and result.new_status is JobStatus.CANCELLED:
        note = "cancelled before it started"
    elif result.cancellation_initiated:
        note = "cancel requested: its worker will stop it (see `taskq job ID`)"
    elif result.new_status.is_terminal:
        note = f"nothing to do: the job had already ended {result.new_status.value}"
    else:
        note = "nothing new: a cancel request for this job is already in flight"
    return f"{head}\n{note}"


def bulk_cancel_summary(result: BulkCancelResult) -> str:
    """Counts by the status each job had before the cancel."""
    if result.total == 0:
        return "no unfinished job matched: nothing cancelled"
    order = [s for s in JobStatus if s in result.by_previous_status]
    rows: list[tuple[object, ...]] = [(s.value, result.by_previous_status[s]) for s in order]
    rows.append(("total", result.total))
    text = table(("previous status", "jobs"), rows)
    return (
        f"{text}\n{result.cancelled_before_start} cancelled before start, "
        f"{result.running_requested} running asked to stop"
    )


def workflow_cancel_summary(result: WorkflowCancelResult) -> str:
    """What `taskq cancel --workflow ID` did: the members per outcome."""
    rows: list[tuple[object, ...]] = [
        ("cancelled (were waiting)", result.cancelled),
        ("  of which sleeping or waiting for a signal", result.suspended),
        ("asked to stop (running)", result.cancel_requested),
        ("cancel already in flight", result.already_cancelling),
        ("already ended", result.already_ended),
        ("members", result.members),
    ]
    note = ("running members go through the cancel ladder on their workers (see `taskq jobs --workflow "
            f"{result.workflow_id}`)") if result.cancel_requested else "nothing is left running"
    return f"workflow {result.workflow_id}\n{table(('outcome', 'jobs'), rows)}\n{note}"


def requeue_summary(result: RequeueResult) -> str:
    """What one `taskq requeue ID` did, on one line: the raw fields, then what they mean."""
    head = (
        f"job {result.job_id}: {result.previous_status.value} -> {result.new_status.value}, "
        f"requeued={str(result.requeued).lower()}"
    )
    if result.requeued:
        revived = f"; {len(result.revived)} dependent job(s) wait for it again" if result.revived else ""
        return f"{head}: back in the queue, due now{revived}"
    if result.conflict_job_id is not None:
        return f"{head}: its unique key is held by job {result.conflict_job_id}; nothing changed"
    return f"{head}: only failed, crashed or abandoned jobs can be requeued; nothing changed"


def bulk_requeue_summary(result: BulkRequeueResult) -> str:
    """Counts by the status each job had before the requeue, then the jobs left alone."""
    if result.total == 0 and not result.conflicts:
        return "no failed, crashed or abandoned job matched: nothing requeued"
    order = [s for s in JobStatus if s in result.by_previous_status]
    rows: list[tuple[object, ...]] = [(s.value, result.by_previous_status[s]) for s in order]
    rows.append(("total", result.total))
    text = table(("previous status", "jobs requeued"), rows)
    if result.conflicts:
        shown = ", ".join(f"{job} (held by {holder})" for job, holder in list(result.conflicts.items())[:5])
        more = f" and {len(result.conflicts) - 5} more" if len(result.conflicts) > 5 else ""
        text += f"\n{len(result.conflicts)} left unchanged, their unique key held by another job: {shown}{more}"
    return text


def pause_line(name: str, paused: bool, changed: bool) -> str:
    """What a pause or resume of a queue or a schedule did: `mail: paused`, `mail: already resumed`."""
    verb = "paused" if paused else "resumed"
    name = printable(name)
    return f"{name}: {verb}" if changed else f"{name}: already {verb}"
