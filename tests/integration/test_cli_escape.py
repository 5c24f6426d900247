"""The real `taskq` CLI prints names anyone with an enqueue grant can choose (actor, tag, error message)
with their control characters escaped: no escape sequence reaches the operator's terminal."""

from __future__ import annotations

import os
import subprocess
import sys

from testkit import query

ACTOR = "evil\x1b[2J\x1b]0;pwned\x07\x1b[31mFAKE"
TAG = "\x1b[8mhidden"
MESSAGE = "boom\x1b[2K\x9b31m"


def taskq(dsn: str, *args: str) -> str:
    env = {**os.environ, "TASKQ_DSN": dsn}
    result = subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, timeout=60,
                            check=True)
    return result.stdout.decode()


def test_jobs_and_job_escape_control_characters_in_every_cell(dsn: str) -> None:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload, tags, status, finished_at, error_class, error_message,"
                        " revision) VALUES (%s, '{}', %s, 'failed', now(), 'Boom', %s, 2) RETURNING id",
                   ACTOR, [TAG], MESSAGE)
    listed = taskq(dsn, "jobs")
    detail = taskq(dsn, "job", str(row[0]))
    as_json = taskq(dsn, "job", str(row[0]), "--json")
    for out in (listed, detail, as_json):
        assert not any((ord(ch) < 0x20 and ch != "\n") or 0x7F <= ord(ch) < 0xA0 for ch in out), repr(out)
    assert "evil\\x1b[2J\\x1b]0;pwned\\x07\\x1b[31mFAKE" in listed
    assert "\\x1b[8mhidden" in detail and "boom\\x1b[2K\\x9b31m" in detail
