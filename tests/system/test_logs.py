"""A real worker's log lines: `--log-format json` / TASKQ_LOG_FORMAT gives one JSON object per line with the
job's fields, each attempt has an INFO start and finish line with its duration and outcome (off with
`--log-job-lines false`), and a payload is never logged."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from testkit import insert_job, query, wait_until

pytestmark = pytest.mark.slow

SECRET = "payload-secret-7f3a"


def _run_two_jobs(spawn_worker: Any, dsn: str, **settings: Any) -> str:
    worker = spawn_worker(**settings)
    worker.worker_id()
    ok = insert_job(dsn, "test.noop", 7)
    bad = insert_job(dsn, "test.echo_fail", {"secret": SECRET}, max_attempts=1)
    wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.jobs WHERE status IN ('succeeded', 'failed') "
                                  "AND id = ANY(%s)", [ok, bad])[0][0] == 2, timeout=60)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.log()
    log = str(worker.log())
    assert SECRET not in log, "a payload was logged"
    return log


def test_json_log_lines_carry_the_job_fields_with_start_and_finish_lines(spawn_worker: Any, dsn: str) -> None:
    log = _run_two_jobs(spawn_worker, dsn, log_format="json")
    records = [json.loads(line) for line in log.splitlines() if line.strip()]  # every line is one object
    jobs = [r for r in records if r["logger"] == "taskq.jobs"]
    noop = [r for r in jobs if r["actor"] == "test.noop"]
    assert [r.get("outcome") for r in noop] == [None, "succeeded"], noop
    finish = noop[1]
    assert {"job_id", "attempt", "queue", "worker_id", "duration_s", "time", "level", "pid"} <= set(finish)
    assert finish["level"] == "INFO" and finish["queue"] == "default" and finish["attempt"] == 1
    assert "succeeded in" in finish["message"]
    failed = [r for r in jobs if r["actor"] == "test.echo_fail" and r.get("outcome")]
    assert failed and failed[0]["outcome"] == "failed" and "ValueError" in failed[0]["message"], log


def test_text_lines_by_default_and_no_job_lines_when_turned_off(spawn_worker: Any, dsn: str) -> None:
    log = _run_two_jobs(spawn_worker, dsn, log_job_lines="false")
    assert "started: queues=" in log and "succeeded in" not in log and " started\n" not in log
