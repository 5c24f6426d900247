"""`taskq enqueue --unique-key`, `taskq requeue`, and what `taskq job` / `taskq jobs` show of them,
run as real subprocesses against a real PostgreSQL."""

from __future__ import annotations

import json

import pytest
from test_cli import ok, run_cli, user_error
from testkit import query

pytestmark = pytest.mark.timeout(120)


def test_enqueue_with_a_unique_key_prints_the_holder_and_writes_nothing_the_second_time(dsn: str) -> None:
    first = ok(run_cli("enqueue", "a.b", "--payload", "1", "--unique-key", "order-7", dsn=dsn)).strip()
    again = run_cli("enqueue", "a.b", "--payload", "2", "--unique-key", "order-7", dsn=dsn)
    assert again.returncode == 0 and again.stdout.strip() == first
    assert again.stderr.startswith("taskq: note: unique key held by this existing job (pending)")
    as_json = json.loads(ok(run_cli("enqueue", "a.b", "--payload", "3", "--unique-key", "order-7", "--json",
                                    dsn=dsn)))
    assert as_json["id"] == first and as_json["created"] is False and as_json["unique_key"] == "order-7"
    kept = json.loads(ok(run_cli("enqueue", "a.b", "--payload", "4", "--unique-key", "other",
                                 "--unique-scope", "retained", "--json", dsn=dsn)))
    assert kept["created"] is True and kept["unique_scope"] == "retained"
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 2


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--unique-key", ""), "unique_key must be 1-255 characters"),
        (("--unique-key", "k" * 256), "unique_key must be 1-255 characters"),
        (("--unique-key", "k", "--unique-scope", "forever"), "invalid choice: 'forever'"),
        (("--unique-scope", "retained"), "needs a unique_key"),
    ],
)
def test_a_bad_unique_key_or_scope_is_a_usage_error(dsn: str, args: tuple[str, ...], fragment: str) -> None:
    line = user_error(run_cli("enqueue", "a.b", "--payload", "{}", *args, dsn=dsn), 2)
    assert fragment in line
    assert query(dsn, "SELECT count(*) FROM taskq.jobs")[0][0] == 0
