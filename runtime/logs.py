"""taskq's log lines: the text or JSON format (`--log-format json`, TASKQ_LOG_FORMAT), and the INFO line
of each job's start and finish.

JSON: one object per line, `time`, `level`, `logger`, `message`, `pid`, and the job fields a record carries
(`job_id`, `actor`, `attempt`, `queue`, `worker_id`, `outcome`, `duration_s`) plus `trace_id` and
`span_id` when OpenTelemetry traces (taskq.tracing). Payloads are never logged: the job lines carry ids,
names and outcomes only. For structlog, wrap this with structlog's ProcessorFormatter or pass `extra=`
fields through; nothing here depends on it.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from taskq import tracing

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"
JOB_FIELDS = ("job_id", "actor", "attempt", "queue", "worker_id", "outcome", "duration_s", "cancel_origin")

log = logging.getLogger("taskq.jobs")


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for name in JOB_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                doc[name] = value
        doc |= tracing.trace_ids()
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def configure_logging(log_format: str = "text") -> None:
    """INFO and above to stderr, as text or JSON lines (the root logger, as logging.basicConfig)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def current_log_format() -> str:
    """"json" when the root logger writes JSON lines (configure_logging("json")), else "text": what a
    process actor's child is told to write."""
    return "json" if any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers) else "text"


class JobLines:
    """The INFO line at each attempt's start and end, like Celery's "Task ... succeeded in 0.52s"
    (setting `log_job_lines` turns them off)."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def _fields(self, job: Any) -> dict[str, Any]:
        return {"job_id": str(job.id), "actor": job.actor, "attempt": job.attempt, "queue": job.queue,
                "worker_id": self.worker_id}

    def started(self, job: Any) -> None:
        if log.isEnabledFor(logging.INFO):
            self._emit("job %s %s attempt %d started", (job.id, job.actor, job.attempt), self._fields(job))

    def finished(self, job: Any, outcome: str, seconds: float, detail: Any) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        fields = self._fields(job) | {"outcome": outcome, "duration_s": round(seconds, 6)}
        suffix = f": {detail}" if detail is not None and outcome != "snoozed" else f" {detail}" if detail else ""
        self._emit("job %s %s attempt %d %s in %.3fs%s", (job.id, job.actor, job.attempt, outcome, seconds, suffix),
                   fields)

    @staticmethod
    def _emit(message: str, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        # log.info() would also look up the caller's frame (a third of a line's cost) for a file and line
        # number these lines never show
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, args, None, extra=fields))
