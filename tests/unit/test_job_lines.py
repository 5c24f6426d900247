"""The job lines' direct path (taskq.logs.StderrHandler.job_line): a line is the same as the record path
would write, it is written by the end of the event loop's turn and before any later record, and it goes
through logging as a record whenever the application put anything else in the way."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from taskq import logs

JOB = SimpleNamespace(id=uuid.UUID("0b9f6d9e-8d7e-4c52-9d31-1c1d6f3f0a11"), actor="mail.send", attempt=2,
                      queue="mail")


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    saved = (list(root.handlers), list(root.filters), root.level)
    yield root
    root.handlers[:], root.filters[:] = saved[0], saved[1]
    root.setLevel(saved[2])


def _install(root: logging.Logger, log_format: str) -> tuple[logs.StderrHandler, io.StringIO]:
    logs.configure_logging(log_format)
    handler = root.handlers[0]
    assert isinstance(handler, logs.StderrHandler)
    stream = io.StringIO()
    handler.setStream(stream)
    return handler, stream


def test_the_direct_path_is_taken_only_when_taskqs_handler_is_the_only_sink(root_logging: logging.Logger) -> None:
    handler, _ = _install(root_logging, "text")
    assert logs._direct_sink() is handler
    root_logging.addFilter(lambda record: True)
    assert logs._direct_sink() is None, "a filter on the way must see the record"
    root_logging.filters.clear()
    extra = logging.StreamHandler(io.StringIO())
    root_logging.addHandler(extra)
    assert logs._direct_sink() is None, "a second handler must get the record"
    root_logging.removeHandler(extra)
    logs.log.addHandler(extra)
    try:
        assert logs._direct_sink() is None, "a handler on taskq.jobs itself must get the record"
    finally:
        logs.log.removeHandler(extra)
    assert logs._direct_sink() is handler


def test_a_json_line_has_the_same_fields_as_the_record_path_writes(root_logging: logging.Logger) -> None:
    _, stream = _install(root_logging, "json")
    lines = logs.JobLines("w-9")
    lines.finished(JOB, "failed", 0.25, "ValueError")  # outside an event loop: written at once
    direct = json.loads(stream.getvalue())
    root_logging.addFilter(lambda record: True)  # forces the ordinary record path, through the same handler
    stream.truncate(0)
    stream.seek(0)
    lines.finished(JOB, "failed", 0.25, "ValueError")
    recorded = json.loads(stream.getvalue())
    assert direct.pop("time")[:19] == recorded.pop("time")[:19]
    assert direct == recorded
    assert direct["message"] == f"job {JOB.id} mail.send attempt 2 failed in 0.250s: ValueError"
    assert direct["pid"] == os.getpid() and direct["outcome"] == "failed" and direct["duration_s"] == 0.25


def test_a_text_line_matches_the_text_format(root_logging: logging.Logger) -> None:
    handler, stream = _install(root_logging, "text")
    logs.JobLines("w-9").started(JOB)
    direct = stream.getvalue()
    stream.truncate(0)
    stream.seek(0)
    record = logging.LogRecord("taskq.jobs", logging.INFO, __file__, 0, "job %s %s attempt %d started",
                               (JOB.id, JOB.actor, JOB.attempt), None)
    expected = handler.format(record) + "\n"
    assert direct[:19] == expected[:19] and direct[23:] == expected[23:], (direct, expected)  # up to the millis


def test_lines_are_written_by_the_end_of_the_loops_turn_and_before_any_later_record(
        root_logging: logging.Logger) -> None:
    _, stream = _install(root_logging, "text")
    lines = logs.JobLines("w-9")
    seen: dict[str, str] = {}

    async def main() -> None:
        lines.started(JOB)
        lines.finished(JOB, "succeeded", 0.001, None)
        seen["same turn"] = stream.getvalue()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        seen["next turn"] = stream.getvalue()
        lines.started(JOB)
        logging.getLogger("taskq.worker").warning("a warning after the third line")
        seen["after a record"] = stream.getvalue()

    asyncio.run(main())
    assert seen["same turn"] == "", "kept until the end of the turn"
    assert seen["next turn"].count("\n") == 2 and "succeeded in 0.001s" in seen["next turn"]
    last = seen["after a record"].splitlines()
    assert last[2].endswith(" started") and last[3].endswith("a warning after the third line"), last


EXIT_SCRIPT = """
import asyncio, sys, uuid
from types import SimpleNamespace
from taskq import logs
logs.configure_logging("text")
job = SimpleNamespace(id=uuid.uuid4(), actor="a", attempt=1, queue="q")

async def main():
    logs.JobLines("w").started(job)  # kept for the end of this turn, which never comes
    sys.exit(3)

asyncio.run(main())
"""


def test_a_line_kept_when_the_process_exits_is_written_once() -> None:
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count(" started\n") == 1, done.stderr


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_write_its_parents_kept_lines_again(root_logging: logging.Logger) -> None:
    handler, _ = _install(root_logging, "text")
    read_fd, write_fd = os.pipe()
    handler.setStream(os.fdopen(os.dup(write_fd), "w"))

    async def start_one_then_fork() -> int:
        logs.JobLines("w-9").started(JOB)  # kept until the end of this turn
        pid = os.fork()  # as a process actor's child is forked from the worker's loop
        if pid == 0:  # the child: what it writes at its exit goes into the same pipe
            handler.flush()
            os._exit(0)
        return pid

    os.waitpid(asyncio.run(start_one_then_fork()), 0)
    handler.flush()
    handler.stream.close()
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        written = pipe.read()
    assert written.count(" started\n") == 1, written


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.parametrize("log_format", ["text", "json"])
def test_a_forked_childs_lines_name_its_own_pid(root_logging: logging.Logger, log_format: str) -> None:
    # the handler keeps its process's pid (os.getpid() is a system call per line); a fork must not keep the parent's
    handler, _ = _install(root_logging, log_format)
    read_fd, write_fd = os.pipe()
    handler.setStream(os.fdopen(os.dup(write_fd), "w"))
    logs.JobLines("w-9").started(JOB)  # outside a loop: written at once, by the parent
    pid = os.fork()
    if pid == 0:
        try:
            logs.JobLines("w-9").finished(JOB, "succeeded", 0.001, None)
            handler.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    handler.stream.close()
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        lines = pipe.read().splitlines()
    assert len(lines) == 2, lines
    if log_format == "json":
        assert [json.loads(line)["pid"] for line in lines] == [os.getpid(), pid]
    else:
        assert f"[{os.getpid()}] " in lines[0] and f"[{pid}] " in lines[1], lines


def test_a_broken_stream_does_not_raise_into_the_worker(root_logging: logging.Logger,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    handler, _ = _install(root_logging, "text")

    class Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError("stderr is gone")

    handler.setStream(Broken())
    errors: list[Any] = []
    monkeypatch.setattr(handler, "handleError", lambda record: errors.append(record))
    logs.JobLines("w-9").started(JOB)
    assert len(errors) == 1
    assert sys.exc_info() == (None, None, None)
