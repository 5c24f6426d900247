"""taskq's log lines: the text or JSON format (`--log-format json`, TASKQ_LOG_FORMAT), and the INFO line
of each job's start and finish.

JSON: one object per line, `time`, `level`, `logger`, `message`, `pid`, and the job fields a record carries
(`job_id`, `actor`, `attempt`, `queue`, `worker_id`, `outcome`, `duration_s`) plus `trace_id` and
`span_id` when OpenTelemetry traces (taskq.tracing). Payloads are never logged: the job lines carry ids,
names and outcomes only. For structlog, wrap this with structlog's ProcessorFormatter or pass `extra=`
fields through; nothing here depends on it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import weakref
from datetime import UTC, datetime
from typing import Any, TextIO

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
        fields = record.__dict__.get("fields")
        if isinstance(fields, dict):  # a record's structured fields (the web's access lines)
            doc |= fields
        doc |= tracing.trace_ids()
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


_encode_json = json.JSONEncoder(default=str, ensure_ascii=False).encode
_handlers: weakref.WeakSet[StderrHandler] = weakref.WeakSet()


class StderrHandler(logging.StreamHandler[TextIO]):
    """The handler configure_logging installs. Ordinary records are formatted and written at once, as by
    logging.StreamHandler. The job lines (JobLines) skip the LogRecord when this handler is the only place
    they go: `job_line` formats them directly, as the formatter would, and keeps them until the end of the
    event loop's current turn, then writes them in one call. Any other record writes the kept lines first,
    so the order of lines is the order of events, and logging.shutdown (at exit) writes what is left.
    That makes a job line cost a few microseconds instead of a record's formatting and a write each."""

    def __init__(self, stream: TextIO, log_format: str) -> None:
        super().__init__(stream)
        self.json = log_format == "json"
        self.setFormatter(JsonFormatter() if self.json else logging.Formatter(TEXT_FORMAT))
        self._pending: list[str] = []
        self._flush_due = False
        self._second = -1  # the second whose time stamp prefix is cached
        self._stamp = ""
        self._pid = os.getpid()  # each job line names it: os.getpid() is a system call (glibc caches no pid)
        _handlers.add(self)

    def job_line(self, message: str, fields: dict[str, Any] | None) -> None:
        """Keep one job line, to be written at the end of the event loop's turn (at once outside a loop).
        `fields` are the record's job fields, for a JSON line."""
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._stamp = (datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%S.") if self.json
                           else time.strftime("%Y-%m-%d %H:%M:%S,", time.localtime(second)))
        millis = int((now - second) * 1000)
        if fields is not None and self.json:
            doc = {"time": f"{self._stamp}{millis:03d}+00:00", "level": "INFO", "logger": log.name,
                   "message": message, "pid": self._pid} | fields
            doc |= tracing.trace_ids()
            line = _encode_json(doc)
        else:
            line = f"{self._stamp}{millis:03d} INFO {log.name} [{self._pid}] {message}"
        with self.lock or _NO_LOCK:
            self._pending.append(line)
            if self._flush_due:
                return
            self._flush_due = True
        try:
            asyncio.get_running_loop().call_soon(self.flush)
        except RuntimeError:  # no event loop in this thread: write it now
            self.flush()

    def flush(self) -> None:
        with self.lock or _NO_LOCK:
            self._write_pending()
            super().flush()

    def emit(self, record: logging.LogRecord) -> None:
        self._write_pending()  # handle() holds the lock
        super().emit(record)

    def _write_pending(self) -> None:
        self._flush_due = False
        if self._pending:
            lines, self._pending = self._pending, []
            try:
                self.stream.write("\n".join(lines) + self.terminator)
            except Exception:  # as StreamHandler.emit: a broken stderr must not stop the worker
                self.handleError(logging.makeLogRecord({"msg": "job lines", "levelno": logging.INFO}))

    def _forked(self) -> None:
        # a forked child would otherwise write its parent's unwritten lines a second time at its exit, and
        # name its parent's pid in its own lines
        self._pending = []
        self._flush_due = False
        self._pid = os.getpid()


def _after_fork_in_child() -> None:
    for handler in list(_handlers):
        handler._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


_NO_LOCK = _NoLock()


def configure_logging(log_format: str = "text") -> None:
    """INFO and above to stderr, as text or JSON lines (the root logger, as logging.basicConfig)."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, got {log_format!r}")
    handler = StderrHandler(sys.stderr, log_format)
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

    def started(self, job: Any) -> None:
        if log.isEnabledFor(logging.INFO):
            self._emit("job %s %s attempt %d started", (tracing.id_text(job), job.actor, job.attempt), job, None)

    def finished(self, job: Any, outcome: str, seconds: float, detail: Any) -> None:
        if not log.isEnabledFor(logging.INFO):
            return
        suffix = f": {detail}" if detail is not None and outcome != "snoozed" else f" {detail}" if detail else ""
        self._emit("job %s %s attempt %d %s in %.3fs%s",
                   (tracing.id_text(job), job.actor, job.attempt, outcome, seconds, suffix),
                   job, {"outcome": outcome, "duration_s": round(seconds, 6)})

    def _emit(self, message: str, args: tuple[Any, ...], job: Any, outcome: dict[str, Any] | None) -> None:
        sink = _direct_sink()
        if sink is not None and not sink.json:  # a text line shows only the message: no fields to build
            sink.job_line(message % args, None)
            return
        fields = {"job_id": tracing.id_text(job), "actor": job.actor, "attempt": job.attempt, "queue": job.queue,
                  "worker_id": self.worker_id}
        if outcome is not None:
            fields |= outcome
        if sink is not None:
            sink.job_line(message % args, fields)
            return
        # log.info() would also look up the caller's frame (a third of a line's cost) for a file and line
        # number these lines never show
        log.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, message, args, None, extra=fields))


def _direct_sink() -> StderrHandler | None:
    """taskq's own StderrHandler when a record of `taskq.jobs` would reach that handler and nothing else
    (no other handler or filter on the way, as after configure_logging); else None, and the line goes
    through logging as an ordinary record, to whatever the application configured."""
    node = log
    while node.parent is not None:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    handlers = node.handlers
    if len(handlers) != 1 or node.filters:
        return None
    handler = handlers[0]
    if type(handler) is not StderrHandler or handler.filters or handler.level > logging.INFO:
        return None
    return handler
