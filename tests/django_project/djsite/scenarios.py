"""Run by tests/integration/test_django_tasks.py beside a real `taskq worker` for Django tasks: drives
the public django.tasks API (enqueue, get_result, refresh, atomic) and prints one JSON object of what it
saw, which the test asserts on."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import django

django.setup()

import psycopg  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from django.utils import timezone  # noqa: E402
from shop.tasks import add, elsewhere, fail, with_context  # noqa: E402

from taskq.contrib.django._compat import FRAMEWORK  # noqa: E402

FINISHED = ("SUCCESSFUL", "FAILED")


def finished(result: Any, timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while result.status not in FINISHED:
        assert time.monotonic() < deadline, f"task {result.id} still {result.status} after {timeout} s"
        time.sleep(0.05)
        result.refresh()
    return result


def error_of(call: Any) -> str:
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def main() -> dict[str, Any]:
    seen: dict[str, Any] = {"framework": FRAMEWORK, "django": django.get_version()}
    ok = add.enqueue(2, 3)
    seen["enqueued"] = {"status": str(ok.status), "id": ok.id, "args": ok.args}
    done = finished(ok)
    seen["add"] = {"status": str(done.status), "return": done.return_value, "attempts": done.attempts,
                   "same": add.get_result(ok.id).return_value}

    bad = finished(fail.enqueue("no such thing"))
    seen["fail"] = {"status": str(bad.status), "errors": [(e.exception_class_path, e.traceback) for e in bad.errors]}

    rolled: dict[str, str] = {}
    try:
        with transaction.atomic():
            rolled["id"] = add.enqueue(100, 1).id
            raise RuntimeError("the view failed")
    except RuntimeError:
        pass
    seen["rolled_back"] = error_of(lambda: add.get_result(rolled["id"]))

    with transaction.atomic():
        kept = add.enqueue(1, 1)
        with psycopg.connect(_dsn()) as other:
            seen["invisible_before_commit"] = other.execute(
                "SELECT count(*) FROM taskq.jobs WHERE id = %s", (kept.id,)).fetchone() == (0,)
    seen["kept"] = str(finished(kept).status)

    due = timezone.now() + timedelta(seconds=2)
    later = add.using(run_after=due).enqueue(5, 5)
    seen["later_first"] = str(later.status)
    later = finished(later)
    seen["later"] = {"status": str(later.status), "started_after_due": later.started_at >= due,
                     "return": later.return_value}

    ctx = finished(with_context.enqueue("t"))
    seen["context"] = {"status": str(ctx.status), "return": ctx.return_value, "id": ctx.id}

    routed = add.using(queue_name="other", priority=50).enqueue(7, 8)
    with psycopg.connect(_dsn()) as other:
        seen["routed_row"] = other.execute("SELECT queue, priority FROM taskq.jobs WHERE id = %s",
                                           (routed.id,)).fetchone()
    seen["routed"] = str(finished(routed).status)

    with transaction.atomic():
        seen["not_json"] = error_of(lambda: add.enqueue(object(), 1))
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            seen["usable_after_not_json"] = cursor.fetchone() == (1,)
    seen["no_schema"] = error_of(lambda: elsewhere.enqueue())
    seen["unknown_result"] = error_of(lambda: add.get_result("not-a-job-id"))
    return seen


def _dsn() -> str:
    import os

    return os.environ["TASKQ_DJANGO_DSN"]


if __name__ == "__main__":
    print(json.dumps(main(), default=str))
