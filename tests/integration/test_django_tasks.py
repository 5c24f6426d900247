"""Django's Tasks framework on taskq, through the public API with a real taskq worker: a real Django project
(tests/django_project) drives `@task(...).enqueue()`, `get_result()` and `transaction.atomic()` in a process
of its own (tests/django_project/djsite/scenarios.py) while `taskq worker taskq.contrib.django.worker:actors`
runs the tasks. Django 6 (django.tasks) where the interpreter allows it (Python >= 3.12: CI's 3.13 step);
the django-tasks backport on Django 5.2 on Python 3.11."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

PROJECT = Path(__file__).resolve().parents[1] / "django_project"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def _env(dsn: str, empty_dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env |= {"DJANGO_SETTINGS_MODULE": "djsite.settings", "TASKQ_DJANGO_DSN": dsn, "TASKQ_DJANGO_EMPTY_DSN": empty_dsn,
            "PYTHONPATH": str(PROJECT), "TASKQ_DSN": dsn}
    return env


@pytest.fixture
def seen(dsn: str, empty_dsn: str) -> Iterator[dict[str, Any]]:
    env = _env(dsn, empty_dsn)
    worker = subprocess.Popen(
        [sys.executable, "-m", "taskq.cli", "worker", "taskq.contrib.django.worker:actors", "--queues",
         "default,other", "--poll-interval", "0.2"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc = subprocess.run([sys.executable, "-m", "djsite.scenarios"], env=env, capture_output=True, text=True,
                              timeout=240, cwd=PROJECT)
        assert proc.returncode == 0, proc.stderr
        yield json.loads(proc.stdout.strip().splitlines()[-1])
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err


def test_django_tasks_run_on_a_taskq_worker_through_the_public_api(seen: dict[str, Any]) -> None:
    expected = "django.tasks" if sys.version_info >= (3, 12) else "django_tasks"
    assert seen["framework"] == expected, seen
    # enqueue gives a READY result, then SUCCESSFUL with the return value
    assert seen["enqueued"]["status"] == "READY" and seen["enqueued"]["args"] == [2, 3]
    assert seen["add"] == {"status": "SUCCESSFUL", "return": 5, "attempts": 1, "same": 5}
    # an exception gives FAILED with its class path and traceback
    assert seen["fail"]["status"] == "FAILED"
    [(path, trace)] = seen["fail"]["errors"]
    assert path == "builtins.LookupError" and "no such thing" in trace and "Traceback" in trace
    # an enqueue inside an atomic() block that raised never existed, so never runs
    assert seen["rolled_back"].startswith("TaskResultDoesNotExist"), seen["rolled_back"]
    assert seen["invisible_before_commit"] and seen["kept"] == "SUCCESSFUL"
    # run_after is honoured
    assert seen["later_first"] == "READY"
    assert seen["later"] == {"status": "SUCCESSFUL", "started_after_due": True, "return": 10}
    # takes_context, queue_name and priority
    assert seen["context"]["status"] == "SUCCESSFUL"
    assert seen["context"]["return"] == {"attempt": 1, "id": seen["context"]["id"], "tag": "t"}
    assert seen["routed_row"] == ["other", -50] and seen["routed"] == "SUCCESSFUL"
    # bad input: refused clearly, the caller's transaction still usable
    assert seen["not_json"].startswith("PayloadInvalid: the arguments of Django task 'shop.tasks.add' are not "
                                       "JSON-serialisable"), seen["not_json"]
    assert seen["usable_after_not_json"] is True
    assert seen["no_schema"].startswith("SchemaNotReady") and "taskq migrate" in seen["no_schema"], seen["no_schema"]
    assert seen["unknown_result"].startswith("TaskResultDoesNotExist"), seen["unknown_result"]
