"""Who may write tokens, receipts and the operator audit (sql/roles.sql with its web and admin roles,
migration 15): each way the client role (every producer) could mint a token, un-revoke one, forge the audit
or delete receipts is refused; the web role runs the whole web API and no more; the admin role creates and
revokes tokens through the owner functions; revoked_at is write-once; the audit functions check what they
write; refused writes repeated on one job are folded into one row; the CLI's operator writes are audited
under the database role; and no role may call the SECURITY DEFINER trigger functions.

Roles are created per test, as in test_security_roles.py (whose helpers this module uses)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb
from test_cli import run_cli
from test_security_roles import create_roles, drop_roles, psql_binary, roles_script
from testkit import WebServer, query

from taskq.backend import Backend
from taskq.ops.tokens import ACTIONS, create_token, revoke_token

pytestmark = pytest.mark.timeout(120)


@dataclass
class Roles:
    worker: str
    client: str
    web: str
    admin: str
    dsn: dict[str, str]


def apply_script(dsn: str, **roles: str) -> subprocess.CompletedProcess[str]:
    psql = psql_binary()
    assert psql is not None, "psql is needed to run sql/roles.sql (its \\if needs psql itself)"
    variables = [x for name, role in roles.items() for x in ("-v", f"{name}={role}")]
    return subprocess.run([psql, dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", *variables, "-f", "-"],
                          input=roles_script(), capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def roles(admin_dsn: str, dsn: str) -> Iterator[Roles]:
    tag = uuid.uuid4().hex[:8]
    names = {kind: f"taskq_{kind}_{tag}" for kind in ("worker", "client", "web", "admin")}
    create_roles(admin_dsn, *names.values())
    try:
        done = apply_script(dsn, **{f"{kind}_role": name for kind, name in names.items()})
        assert done.returncode == 0, done.stderr
        yield Roles(**names, dsn={kind: make_conninfo(dsn, user=name) for kind, name in names.items()})
    finally:
        drop_roles(admin_dsn, dsn, *names.values())


def job(dsn: str, queue: str = "default", status: str = "pending") -> uuid.UUID:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, queue, payload) VALUES ('sec.x', %s, '{}') RETURNING id", queue)
    jid = uuid.UUID(str(row[0]))
    if status == "succeeded":
        query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'succeeded', finished_at = now() "
                   "WHERE id = %s", jid)
    return jid


async def tokens_as_owner(dsn: str, *specs: tuple[str, list[str]]) -> dict[str, str]:
    backend = await Backend.open(dsn, max_size=1)
    try:
        return {name: (await create_token(backend, name, grants))[1] for name, grants in specs}
    finally:
        await backend.close()


def refused(role_dsn: str, statement: str, params: tuple[Any, ...] = (),
            error: type[Exception] = errors.InsufficientPrivilege) -> None:
    with psycopg.connect(role_dsn, autocommit=True) as conn, pytest.raises(error):
        conn.execute(statement.encode(), params or None)


# -- M2: what the client role (and the web and worker roles) can no longer do ------------------------------

M2_STATEMENTS = {
    "un-revoke a token": "UPDATE taskq.api_tokens SET revoked_at = NULL WHERE name = 'reader'",
    "mint a token": "INSERT INTO taskq.api_tokens (name, token_hash, grants, created_by) "
                    "VALUES ('minted', md5('x') || md5('y'), '{*@*}', 'root@ops-laptop')",
    "read the token hashes": "SELECT token_hash FROM taskq.api_tokens",
    "forge an audit row": "INSERT INTO taskq.operator_audit (principal, action, outcome, queue, reason) "
                          "VALUES ('admin', 'queues:pause', 'paused', 'billing', 'forged')",
    "forge an operator event": "INSERT INTO taskq.job_events (job_id, kind, detail) "
                               "SELECT id, 'operator', '{\"principal\": \"admin\"}' FROM taskq.jobs LIMIT 1",
    "delete receipts": "DELETE FROM taskq.operator_requests",
    "write a receipt": "INSERT INTO taskq.operator_requests (principal, key, fingerprint) VALUES ('admin', 'k', 'f')",
    "read the sessions": "SELECT * FROM taskq.web_sessions",
    "call the web audit function": "SELECT taskq.audit_write_v15('admin', 'queues:pause', NULL, NULL, NULL, NULL, "
                                   "NULL, '{}', ARRAY[NULL::uuid], ARRAY['billing'], ARRAY[NULL::bigint], "
                                   "ARRAY['paused'])",
    "create a token through the owner function": "SELECT * FROM taskq.token_create_v15('minted', "
                                                 "md5('x') || md5('y'), '{*@*}', NULL)",
    "revoke a token through the owner function": "SELECT * FROM taskq.token_revoke_v15('admin', NULL)",
}


async def _seed(dsn: str) -> None:
    await tokens_as_owner(dsn, ("admin", ["*@*"]), ("reader", ["jobs:read@*"]))
    backend = await Backend.open(dsn, max_size=1)
    try:
        await revoke_token(backend, "reader")
    finally:
        await backend.close()
    job(dsn)
    query(dsn, "INSERT INTO taskq.operator_requests (principal, key, fingerprint, status, body) "
               "VALUES ('admin', 'kept', 'f', 200, '{}')")


@pytest.mark.parametrize("what", list(M2_STATEMENTS))
async def test_the_client_role_cannot(roles: Roles, dsn: str, what: str) -> None:
    await _seed(dsn)
    refused(roles.dsn["client"], M2_STATEMENTS[what])
    assert query(dsn, "SELECT revoked_at IS NOT NULL FROM taskq.api_tokens WHERE name = 'reader'") == [(True,)]
    assert query(dsn, "SELECT count(*) FROM taskq.api_tokens") == [(2,)]
    assert query(dsn, "SELECT count(*) FROM taskq.operator_requests") == [(1,)]
    assert query(dsn, "SELECT count(*) FROM taskq.job_events WHERE kind = 'operator'") == [(0,)]


WEB_FORBIDDEN = ("un-revoke a token", "mint a token", "forge an audit row", "forge an operator event",
                 "delete receipts", "create a token through the owner function",
                 "revoke a token through the owner function")


@pytest.mark.parametrize("what", WEB_FORBIDDEN)
async def test_the_web_role_cannot(roles: Roles, dsn: str, what: str) -> None:
    await _seed(dsn)
    refused(roles.dsn["web"], M2_STATEMENTS[what])
    assert query(dsn, "SELECT revoked_at IS NOT NULL FROM taskq.api_tokens WHERE name = 'reader'") == [(True,)]
    assert query(dsn, "SELECT count(*) FROM taskq.operator_requests") == [(1,)]


async def test_no_role_inserts_operator_events_directly_not_even_the_owner(roles: Roles, dsn: str) -> None:
    await _seed(dsn)
    statement = M2_STATEMENTS["forge an operator event"]
    for who in ("worker", "admin"):
        refused(roles.dsn[who], statement)
    refused(dsn, statement)  # the owner too: only the audit functions write them
    with psycopg.connect(roles.dsn["client"], autocommit=True) as conn, pytest.raises(errors.InsufficientPrivilege):
        # setting the audit function's flag is not enough: the insert must run as the owner
        conn.execute("SELECT set_config('taskq.operator_event', 'audit_append_v15', false)")
        conn.execute(statement.encode())
    # the other kinds go through untouched
    query(roles.dsn["client"], "INSERT INTO taskq.job_events (job_id, kind) SELECT id, 'note' FROM taskq.jobs")


@pytest.mark.parametrize("function", ["record_lease_loss", "note_settled", "settle_dependents_stmt"])
def test_no_role_may_attach_the_owner_trigger_functions_to_a_table_of_its_own(roles: Roles, function: str) -> None:
    """With EXECUTE (PUBLIC's, before migration 15) a role could attach record_lease_loss to a temporary table
    and write taskq.lease_losses as the owner: a forged lease loss stops a running attempt."""
    for who in ("client", "worker", "web"):
        with psycopg.connect(roles.dsn[who], autocommit=True) as conn:
            conn.execute("CREATE TEMP TABLE mine (id uuid, worker_id text, claim_epoch bigint, status text)")
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(f"CREATE TRIGGER t AFTER UPDATE ON mine FOR EACH ROW "
                             f"EXECUTE FUNCTION taskq.{function}()".encode())


def test_the_script_still_runs_with_the_worker_and_client_roles_only(admin_dsn: str, dsn: str) -> None:
    tag = uuid.uuid4().hex[:8]
    worker, client = f"taskq_worker_{tag}", f"taskq_client_{tag}"
    create_roles(admin_dsn, worker, client)
    try:
        done = apply_script(dsn, worker_role=worker, client_role=client)
        assert done.returncode == 0, done.stderr
        done = apply_script(dsn, worker_role=worker, client_role=client)  # idempotent
        assert done.returncode == 0, done.stderr
        refused(make_conninfo(dsn, user=client), "SELECT name FROM taskq.api_tokens")
    finally:
        drop_roles(admin_dsn, dsn, worker, client)


@pytest.mark.parametrize("who", ["worker", "client", "web"])
async def test_the_invariant_checker_runs_under_the_roles(roles: Roles, who: str) -> None:
    """`taskq check` (taskq.invariants) reads taskq.dependency_backlog, which had no grant."""
    from taskq.invariants import check_invariants

    async with await psycopg.AsyncConnection.connect(roles.dsn[who], autocommit=True) as conn:
        report = await check_invariants(conn)
    assert report.ok, report.render()


# -- the admin role: tokens -------------------------------------------------------------------------------

def test_the_admin_role_creates_lists_and_revokes_tokens_and_each_is_audited(roles: Roles, dsn: str) -> None:
    created = run_cli("tokens", "create", "ops", "--grant", "jobs:read@*", dsn=roles.dsn["admin"],
                      env={"USER": "root", "LOGNAME": "root"})
    assert created.returncode == 0, created.stderr
    assert created.stdout.startswith("tq_")
    listed = run_cli("tokens", "list", "--json", dsn=roles.dsn["admin"])
    assert listed.returncode == 0 and '"ops"' in listed.stdout, listed.stderr
    revoked = run_cli("tokens", "revoke", "ops", dsn=roles.dsn["admin"])
    assert revoked.returncode == 0 and "revoked" in revoked.stdout, revoked.stderr
    again = run_cli("tokens", "revoke", "ops", dsn=roles.dsn["admin"])
    assert again.returncode == 0 and "already revoked" in again.stdout, again.stderr
    # created_by is the database role, whatever $USER says; the OS user is only a labelled claim
    assert query(dsn, "SELECT created_by, revoked_at IS NOT NULL FROM taskq.api_tokens") == [(roles.admin, True)]
    rows = query(dsn, "SELECT principal, action, outcome, db_role, detail ->> 'token', detail ->> 'os_user_claimed' "
                      "FROM taskq.operator_audit ORDER BY id")
    assert [r[:5] for r in rows] == [
        (f"db:{roles.admin}", "tokens:create", "created", roles.admin, "ops"),
        (f"db:{roles.admin}", "tokens:revoke", "revoked", roles.admin, "ops"),
        (f"db:{roles.admin}", "tokens:revoke", "unchanged", roles.admin, "ops"),
    ]
    assert str(rows[0][5]).startswith("root@")
    # the admin role writes no table directly
    refused(roles.dsn["admin"], M2_STATEMENTS["mint a token"])
    refused(roles.dsn["admin"], "UPDATE taskq.api_tokens SET revoked_at = now()")


def test_the_client_role_cannot_run_taskq_tokens_create(roles: Roles, dsn: str) -> None:
    result = run_cli("tokens", "create", "ops", "--grant", "*@*", dsn=roles.dsn["client"])
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert query(dsn, "SELECT count(*) FROM taskq.api_tokens") == [(0,)]


def test_the_token_function_checks_the_grants_it_writes(roles: Roles, dsn: str) -> None:
    admin = roles.dsn["admin"]
    good = "SELECT name FROM taskq.token_create_v18(%s, md5('a') || md5('b'), %s, NULL)"
    refused(admin, good, ("bad", ["root@*"]), errors.InvalidParameterValue)
    refused(admin, good, ("bad", []), errors.InvalidParameterValue)
    refused(admin, good, ("bad", ["jobs:read@"]), errors.InvalidParameterValue)
    refused(admin, "SELECT name FROM taskq.token_create_v18('bad', 'short', '{*@*}', NULL)", (),
            errors.InvalidParameterValue)
    every = [f"{a}@*" for a in (*ACTIONS, "*", "jobs:*", "schedules:*", "workers:*", "queues:*")]
    with psycopg.connect(admin, autocommit=True) as conn:
        assert conn.execute(good.encode(), ("all", every)).fetchall() == [("all",)]
        assert conn.execute(good.encode(), ("all", every)).fetchall() == []  # the name is taken: no row
    assert query(dsn, "SELECT count(*) FROM taskq.operator_audit WHERE action = 'tokens:create'") == [(1,)]


async def test_revoked_at_is_write_once_for_every_role(dsn: str) -> None:
    await tokens_as_owner(dsn, ("reader", ["jobs:read@*"]))
    query(dsn, "UPDATE taskq.api_tokens SET revoked_at = now() - interval '1 day'")
    for statement in ("UPDATE taskq.api_tokens SET revoked_at = NULL",
                      "UPDATE taskq.api_tokens SET revoked_at = now()"):
        refused(dsn, statement)  # the owner (a superuser here) included
    query(dsn, "UPDATE taskq.api_tokens SET last_used_at = now()")  # other columns stay writable
    assert query(dsn, "SELECT revoked_at < now() - interval '1 hour' FROM taskq.api_tokens") == [(True,)]


# -- the audit functions ----------------------------------------------------------------------------------

AUDIT = ("SELECT taskq.audit_write_v15(%s, %s, NULL, NULL, 'req', NULL, NULL, '{}', %s::uuid[], %s::text[], "
         "%s::bigint[], %s::text[])")


async def test_the_web_audit_function_checks_principal_action_outcome_and_queue(roles: Roles, dsn: str) -> None:
    await _seed(dsn)  # admin live, reader revoked
    jid = job(dsn, "billing")
    web = roles.dsn["web"]
    one = ([jid], ["billing"], [1], ["cancelled"])
    refused(web, AUDIT, ("ghost", "jobs:cancel", *one))
    refused(web, AUDIT, ("reader", "jobs:cancel", *one))  # revoked
    refused(web, AUDIT, (f"db:{roles.client}", "jobs:cancel", *one))
    refused(web, AUDIT, ("admin", "tokens:create", [None], [None], [None], ["created"]))
    refused(web, AUDIT, ("admin", "jobs:nuke", *one), errors.InvalidParameterValue)
    bad = errors.InvalidParameterValue
    refused(web, AUDIT, ("admin", "jobs:cancel", [jid], ["billing"], [1], ["obliterated"]), bad)
    refused(web, AUDIT, ("admin", "jobs:cancel", [jid], ["default"], [1], ["cancelled"]), bad)
    refused(web, AUDIT, ("admin", "jobs:cancel", [uuid.uuid4()], ["billing"], [1], ["cancelled"]),
            errors.InvalidParameterValue)
    assert query(dsn, "SELECT count(*) FROM taskq.operator_audit WHERE action NOT LIKE 'tokens:%%'") == [(0,)]
    with psycopg.connect(web, autocommit=True) as conn:
        assert conn.execute(AUDIT.encode(), ("admin", "jobs:cancel", *one)).fetchone() == (1,)
        assert conn.execute(AUDIT.encode(), ("anonymous", "queues:pause", [None], ["billing"], [None],
                                             ["paused"])).fetchone() == (1,)
    assert query(dsn, "SELECT principal, db_role, queue FROM taskq.operator_audit WHERE action NOT LIKE 'tokens:%%' "
                      "ORDER BY id") == [
        ("admin", roles.web, "billing"), ("anonymous", roles.web, "billing")]
    (event,) = query(dsn, "SELECT detail FROM taskq.job_events WHERE job_id = %s AND kind = 'operator'", jid)
    assert event[0]["principal"] == "admin" and event[0]["action"] == "jobs:cancel"


def test_the_cli_audit_function_pins_the_principal_to_the_database_role(roles: Roles, dsn: str) -> None:
    jid = job(dsn, "billing")
    client = roles.dsn["client"]
    session = "SELECT taskq.audit_session_v15(%s, %s, %s, %s, NULL, %s, %s)"
    with psycopg.connect(client, autocommit=True) as conn:
        written = conn.execute(session.encode(), ("jobs:cancel", "cancelled", jid, None, "r", Jsonb({}))).fetchone()
        assert written == (1,)
    refused(client, session, ("jobs:enqueue", "enqueued", jid, None, None, Jsonb({})), errors.InvalidParameterValue)
    refused(client, session, ("tokens:create", "created", None, None, None, Jsonb({})), errors.InvalidParameterValue)
    refused(client, session, ("jobs:cancel", "cancelled", jid, "default", None, Jsonb({})),
            errors.InvalidParameterValue)
    assert query(dsn, "SELECT principal, db_role, queue, job_id FROM taskq.operator_audit") == [
        (f"db:{roles.client}", roles.client, "billing", jid)]


async def test_refused_writes_repeated_on_one_job_fold_into_one_row(roles: Roles, dsn: str) -> None:
    await _seed(dsn)
    jid = job(dsn, "billing", status="succeeded")
    with psycopg.connect(roles.dsn["web"], autocommit=True) as conn:
        for _ in range(20):
            conn.execute(AUDIT.encode(), ("admin", "jobs:cancel", [jid], ["billing"], [2], ["conflict"]))
        # another principal, action or outcome is a row of its own
        conn.execute(AUDIT.encode(), ("anonymous", "jobs:cancel", [jid], ["billing"], [2], ["conflict"]))
        conn.execute(AUDIT.encode(), ("admin", "jobs:requeue", [jid], ["billing"], [2], ["conflict"]))
        conn.execute(AUDIT.encode(), ("admin", "jobs:cancel", [jid], ["billing"], [2], ["cancelled"]))
    rows = query(dsn, "SELECT principal, action, outcome, repeats FROM taskq.operator_audit "
                      "WHERE principal = 'admin' AND action = 'jobs:cancel' AND outcome = 'conflict'")
    # one row per 60 s window: the 20 land in one or (across its edge) two
    assert 1 <= len(rows) <= 2 and sum(1 + r[3] for r in rows) == 20
    assert query(dsn, "SELECT count(*) FROM taskq.operator_audit WHERE job_id = %s", jid) == [(len(rows) + 3,)]
    events = query(dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s AND kind = 'operator'", jid)[0][0]
    assert events == len(rows) + 3


async def test_refused_cancels_through_the_api_do_not_grow_the_audit(roles: Roles, dsn: str, tmp_path: Path) -> None:
    tokens = await tokens_as_owner(dsn, ("admin", ["*@*"]))
    jid = job(dsn, status="succeeded")
    web = WebServer(roles.dsn["web"], log_path=tmp_path / "web.log")
    try:
        async with httpx.AsyncClient(base_url=web.url + "/api/v1", timeout=30,
                                     headers={"Authorization": f"Bearer {tokens['admin']}"}) as c:
            for _ in range(12):
                r = await c.post(f"/jobs/{jid}:cancel", json={"reason": "x" * 9000})
                assert r.status_code == 409, r.text
    finally:
        web.stop()
    rows = query(dsn, "SELECT repeats FROM taskq.operator_audit WHERE job_id = %s", jid)
    assert 1 <= len(rows) <= 2 and sum(1 + r[0] for r in rows) == 12
    assert query(dsn, "SELECT count(*) FROM taskq.job_events WHERE job_id = %s AND kind = 'operator'", jid
                 ) == [(len(rows),)]


# -- the CLI's operator writes are audited ---------------------------------------------------------------

def test_cli_operator_writes_are_audited_under_the_database_role(roles: Roles, dsn: str) -> None:
    client = roles.dsn["client"]
    pending, done = job(dsn, "billing"), job(dsn, "billing", status="succeeded")
    job(dsn, "billing")  # an unfinished job names the queue, so it can be paused
    query(dsn, "INSERT INTO taskq.schedules (name, actor, queue, every_seconds, definition, next_run_at, owner)"
               " VALUES ('nightly', 'sec.x', 'billing', 3600, 'every 3600s', now() + interval '1 hour', 't')")
    for args in (("cancel", str(pending), "--reason", "cli"), ("cancel", str(done)), ("requeue", str(done)),
                 ("queue", "pause", "billing"), ("queue", "resume", "billing"),
                 ("queue", "limit", "billing", "--concurrency", "2"),
                 ("schedule", "pause", "nightly"), ("schedule", "resume", "nightly"),
                 ("schedule", "trigger", "nightly"), ("cancel", "--queue", "billing", "--unfinished")):
        result = run_cli(*args, dsn=client, env={"USER": "root", "LOGNAME": "root"})
        assert result.returncode == 0, (args, result.stdout, result.stderr)
    rows = query(dsn, "SELECT principal, db_role, action, outcome, queue, job_id, schedule "
                      "FROM taskq.operator_audit ORDER BY id")
    assert {(r[0], r[1]) for r in rows} == {(f"db:{roles.client}", roles.client)}
    assert [(r[2], r[3]) for r in rows] == [
        ("jobs:cancel", "cancelled"), ("jobs:cancel", "conflict"), ("jobs:requeue", "conflict"),
        ("queues:pause", "paused"), ("queues:resume", "resumed"), ("queues:limit", "limited"),
        ("schedules:pause", "paused"), ("schedules:resume", "resumed"), ("schedules:trigger", "triggered"),
        ("jobs:cancel", "cancelled")]
    assert rows[0][4:6] == ("billing", pending) and rows[8][6] == "nightly" and rows[8][5] is not None
    # the CLI's rows add no 'operator' event (the job's own events say what changed)
    assert query(dsn, "SELECT count(*) FROM taskq.job_events WHERE kind = 'operator'") == [(0,)]


# -- the web server under the web role ---------------------------------------------------------------------

async def test_the_web_server_runs_the_whole_api_and_dashboard_under_the_web_role(
    roles: Roles, dsn: str, tmp_path: Path
) -> None:
    made = run_cli("tokens", "create", "ops", "--grant", "*@*", dsn=roles.dsn["admin"])
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    pending, failed = job(dsn), job(dsn, "billing")
    query(dsn, "UPDATE taskq.jobs SET revision = revision + 1, status = 'failed', finished_at = now(), attempt = 1 "
               "WHERE id = %s", failed)
    query(dsn, "INSERT INTO taskq.schedules (name, actor, queue, every_seconds, definition, next_run_at, owner)"
               " VALUES ('nightly', 'sec.x', 'default', 3600, 'every 3600s', now() + interval '1 hour', 't')")
    web = WebServer(roles.dsn["web"], log_path=tmp_path / "web.log")
    try:
        auth = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=web.url, timeout=30) as c:
            for path in ("/api/v1/jobs", f"/api/v1/jobs/{pending}", "/api/v1/queues", "/api/v1/stats",
                         "/api/v1/schedules", "/api/v1/cancellations", "/api/v1/workers"):
                r = await c.get(path, headers=auth)
                assert r.status_code == 200, (path, r.text)
            writes = [
                ("/api/v1/jobs", {"actor": "sec.x", "payload": {}}, {201}),
                (f"/api/v1/jobs/{pending}:cancel", {"reason": "web"}, {200}),
                (f"/api/v1/jobs/{pending}:cancel", {}, {409}),
                (f"/api/v1/jobs/{failed}:requeue", {}, {200}),
                ("/api/v1/jobs:cancel", {"filter": {"queue": "billing"}, "limit": 10}, {200}),
                ("/api/v1/queues/default:pause", {}, {200}),
                ("/api/v1/queues/default:resume", {}, {200}),
                ("/api/v1/queues/default:limit", {"concurrency": 3}, {200}),
                ("/api/v1/schedules/nightly:pause", {}, {200}),
                ("/api/v1/schedules/nightly:trigger", {}, {200}),
            ]
            for i, (path, body, expected) in enumerate(writes):
                r = await c.post(path, json=body, headers=auth | {"Idempotency-Key": f"web-role-{i}"})
                assert r.status_code in expected, (path, r.status_code, r.text)
            login = await c.post("/login", data={"token": token})
            assert login.status_code == 303, login.text
            assert (await c.get("/jobs")).status_code == 200
            assert (await c.post("/logout")).status_code == 303
    finally:
        web.stop()
    log = (tmp_path / "web.log").read_text(errors="replace")
    assert "permission denied" not in log and "Traceback" not in log, log
    assert {r[0] for r in query(dsn, "SELECT db_role FROM taskq.operator_audit WHERE principal = 'ops'")} == {roles.web}
    assert query(dsn, "SELECT count(*) FROM taskq.operator_requests")[0][0] >= 9
    assert query(dsn, "SELECT ended_at IS NOT NULL FROM taskq.web_sessions") == [(True,)]
    assert query(dsn, "SELECT last_used_at IS NOT NULL FROM taskq.api_tokens") == [(True,)]


def test_a_cli_write_whose_audit_is_refused_says_so_in_one_line(roles: Roles, dsn: str) -> None:
    """roles.sql not run again after the upgrade: the change is made, the command says its audit was refused."""
    job(dsn, "billing")
    query(dsn, f'REVOKE EXECUTE ON FUNCTION taskq.audit_session_v18(text, text, uuid, text, text, text, jsonb) '
               f'FROM "{roles.client}"')
    result = run_cli("queue", "pause", "billing", dsn=roles.dsn["client"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "audit row was refused" in result.stderr and "roles.sql" in result.stderr
    assert query(dsn, "SELECT paused_at IS NOT NULL FROM taskq.queues WHERE name = 'billing'") == [(True,)]


def test_who_may_execute_each_security_definer_function(roles: Roles, dsn: str) -> None:
    """Every SECURITY DEFINER function of the schema, and the roles of roles.sql that may run it: a new one
    must be added here, with its role, or it is a role-wide hole."""
    expected = {
        "delete_terminal_jobs(uuid[])": {"worker"},
        "delete_finished_attempts(uuid[],bigint[])": {"worker"},
        "delete_operator_requests(text[],text[],double precision)": {"worker"},
        "delete_operator_audit(bigint[],double precision)": {"worker"},
        "settle_backlog(integer)": {"worker"},
        "revive_dependents(uuid[],text)": {"client", "web"},
        "audit_session_v15(text,text,uuid,text,text,text,jsonb)": {"client"},
        "audit_write_v15(text,text,text,text,text,text,bigint,jsonb,uuid[],text[],bigint[],text[])": {"web"},
        "token_create_v15(text,text,text[],text)": {"admin"},
        "token_revoke_v15(text,text)": {"admin"},
        "delete_terminal_jobs_v17(uuid[])": {"worker"},
        "audit_session_v18(text,text,uuid,text,text,text,jsonb)": {"client"},
        "audit_write_v18(text,text,text,text,text,text,bigint,jsonb,uuid[],text[],bigint[],text[])": {"web"},
        "token_create_v18(text,text,text[],text)": {"admin"},
        # a count for autoscalers and doctor (migration 19); the optional monitor role is not made here
        "queue_depth_v19(text[])": {"client", "web", "worker"},
    }
    rows = query(dsn, "SELECT p.oid::regprocedure::text, p.oid FROM pg_proc AS p JOIN pg_namespace AS n"
                      " ON n.oid = p.pronamespace WHERE n.nspname = 'taskq' AND p.prosecdef")
    found: dict[str, set[str]] = {}
    for signature, oid in rows:
        name = str(signature).removeprefix("taskq.")
        found[name] = {kind for kind in ("worker", "client", "web", "admin")
                       if query(dsn, "SELECT has_function_privilege(%s, %s::oid, 'EXECUTE')",
                                getattr(roles, kind), oid)[0][0]}
    found = {name: who for name, who in found.items() if who or name in expected}
    assert found == expected


def test_the_script_with_all_four_roles_grants_the_same_on_every_run(roles: Roles, dsn: str) -> None:
    acl = ("SELECT c.relname, c.relacl::text, (SELECT string_agg(a.attname || '=' || a.attacl::text, ',' ORDER BY"
           " a.attnum) FROM pg_attribute AS a WHERE a.attrelid = c.oid AND a.attacl IS NOT NULL)"
           " FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace WHERE n.nspname = 'taskq'"
           " UNION ALL SELECT p.oid::regprocedure::text, p.proacl::text, NULL FROM pg_proc AS p"
           " JOIN pg_namespace AS n ON n.oid = p.pronamespace WHERE n.nspname = 'taskq' ORDER BY 1")
    first = query(dsn, acl)
    again = apply_script(dsn, **{f"{kind}_role": getattr(roles, kind) for kind in ("worker", "client", "web", "admin")})
    assert again.returncode == 0, again.stderr
    assert query(dsn, acl) == first


def test_taskq_web_under_the_client_role_says_which_role_it_needs(roles: Roles) -> None:
    result = run_cli("web", "--port", "0", dsn=roles.dsn["client"])
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "web role of sql/roles.sql" in result.stderr, result.stderr
