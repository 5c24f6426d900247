"""Actors bound to queues, against a real PostgreSQL: producers that know an actor refuse a queue it is
not bound to (async and sync clients, `ctx.jobs.enqueue`, workflows), and a worker that claims a job of
one of its actors in another queue fails it as ActorQueueMismatch without running the actor's code.
An UnknownActor failure does not list the worker's actors (the worker logs them)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from testkit import running_worker, wait_for, wait_until

from taskq import JobContext, JobsClient, SyncJobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.exceptions import ConfigurationError
from taskq.models import JobStatus

pytestmark = pytest.mark.timeout(60)


def billing_app(ran: list[Any]) -> ActorRegistry:
    """The reviewer's app: a dangerous billing action and a harmless sandbox one."""
    registry = ActorRegistry()

    @actor(name="billing.refund_all", queue="billing", registry=registry)
    async def refund_all(payload: Any) -> str:
        ran.append(("billing.refund_all", payload))
        return "refunded everyone"

    @actor(name="sandbox.echo", queue="sandbox", registry=registry)
    async def echo(payload: Any) -> Any:
        ran.append(("sandbox.echo", payload))
        return payload

    @actor(name="ops.anywhere", queue="sandbox", queues=["*"], registry=registry)
    async def anywhere(payload: Any) -> str:
        ran.append(("ops.anywhere", payload))
        return "ran"

    return registry


async def count_jobs(client: JobsClient) -> int:
    return len(await client.list_jobs(limit=1000))


async def terminal(client: JobsClient, job_id: UUID) -> Any:
    handle = await client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row if handle.row.is_terminal else None


async def test_a_client_that_knows_the_actor_refuses_another_queue_and_writes_nothing(dsn: str) -> None:
    registry = billing_app([])
    async with await JobsClient.connect(dsn, registry=registry) as client:
        for target in ("billing.refund_all", registry["billing.refund_all"]):
            with pytest.raises(ConfigurationError) as raised:
                await client.enqueue(target, {}, queue="sandbox")
            message = str(raised.value)
            assert "'billing.refund_all'" in message and "'sandbox'" in message and "['billing']" in message
            assert "@actor(queues=[...])" in message
            with pytest.raises(ConfigurationError):
                await client.enqueue_many(target, [{}, {}], queue="sandbox")
        assert await count_jobs(client) == 0
        handle = await client.enqueue("billing.refund_all", {})
        assert handle.row is not None and handle.row.queue == "billing"
        anywhere = await client.enqueue("ops.anywhere", {}, queue="billing")
        assert anywhere.row is not None and anywhere.row.queue == "billing"


def test_the_sync_client_refuses_the_same(dsn: str) -> None:
    registry = billing_app([])
    with SyncJobsClient.connect(dsn, registry=registry) as client:
        with pytest.raises(ConfigurationError, match="may not run on queue 'sandbox'"):
            client.enqueue("billing.refund_all", {}, queue="sandbox")
        with pytest.raises(ConfigurationError, match="may not run on queue 'sandbox'"):
            client.enqueue_many("billing.refund_all", [{}], queue="sandbox")
        assert client.list_jobs(limit=10) == []


async def test_ctx_jobs_enqueue_refuses_a_child_on_a_queue_its_actor_may_not_run_on(dsn: str) -> None:
    ran: list[Any] = []
    registry = billing_app(ran)

    @actor(name="sandbox.spawn", queue="sandbox", registry=registry)
    async def spawn(payload: Any, ctx: JobContext[Any]) -> str:
        try:
            await ctx.jobs.enqueue("billing.refund_all", {}, queue="sandbox")
        except ConfigurationError as exc:
            return f"refused: {exc}"
        return "enqueued"

    async with await JobsClient.connect(dsn, registry=registry) as client:
        async with running_worker(dsn, registry, queues=["sandbox"]):
            handle = await client.enqueue(spawn, None)
            row = await handle.wait(timeout=20)
        assert row.status is JobStatus.SUCCEEDED, row
        assert str(row.result).startswith("refused: actor 'billing.refund_all' may not run on queue 'sandbox'")
        assert [j.actor for j in await client.list_jobs(limit=10)] == ["sandbox.spawn"]
    assert ran == []


async def test_a_worker_fails_a_job_in_a_queue_its_actor_is_not_bound_to_without_running_it(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[Any] = []
    registry = billing_app(ran)
    async with await JobsClient.connect(dsn, registry=ActorRegistry()) as producer:
        # a producer without the app's code writes the job by name, as the web API or the CLI may
        smuggled = await producer.enqueue("billing.refund_all", {"all": True}, queue="sandbox", max_attempts=3)
        allowed = await producer.enqueue("sandbox.echo", {"hello": 1}, queue="sandbox")
        anywhere = await producer.enqueue("ops.anywhere", 7, queue="sandbox-2")
        async with running_worker(dsn, registry, queues=["sandbox", "sandbox-2"]):
            row = await wait_for(lambda: terminal(producer, smuggled.job_id), timeout=20)
            ok = await wait_for(lambda: terminal(producer, allowed.job_id), timeout=20)
            any_row = await wait_for(lambda: terminal(producer, anywhere.job_id), timeout=20)
        attempts = await producer.attempts(smuggled.job_id)
        events = await producer.events(smuggled.job_id)
    assert row.status is JobStatus.FAILED and row.error_class == "ActorQueueMismatch", row
    assert row.attempt == 1 and [(a.attempt, a.outcome) for a in attempts] == [(1, "failed")]
    assert events[-1].detail.get("retryable") is False, events[-1]
    message = row.error_message or ""
    assert "'sandbox'" in message and "['billing']" in message and "billing.refund_all" in message
    assert "sandbox.echo" not in message and "ops.anywhere" not in message  # no catalogue
    assert ok.status is JobStatus.SUCCEEDED and any_row.status is JobStatus.SUCCEEDED
    assert ("billing.refund_all", {"all": True}) not in ran
    assert sorted(name for name, _ in ran) == ["ops.anywhere", "sandbox.echo"]


async def test_unknown_actor_failures_do_not_list_the_workers_actors(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    registry = billing_app([])
    async with await JobsClient.connect(dsn, registry=ActorRegistry()) as producer:
        handle = await producer.enqueue("no.such.actor", {}, queue="sandbox")
        with caplog.at_level(logging.INFO, logger="taskq.worker"):
            async with running_worker(dsn, registry, queues=["sandbox"]):
                row = await wait_for(lambda: terminal(producer, handle.job_id), timeout=20)
    assert row.status is JobStatus.FAILED and row.error_class == "UnknownActor"
    message = row.error_message or ""
    assert "no actor named 'no.such.actor'" in message
    for name in ("billing.refund_all", "sandbox.echo", "ops.anywhere"):
        assert name not in message
    # the worker's own log names what it knows, for its operator
    logged = [r.getMessage() for r in caplog.records if "no.such.actor" in r.getMessage()]
    assert len(logged) == 1 and "billing.refund_all" in logged[0] and str(handle.job_id) in logged[0], logged


async def test_requeue_of_a_mismatched_job_fails_it_again_without_running_it(dsn: str) -> None:
    ran: list[Any] = []
    registry = billing_app(ran)
    async with await JobsClient.connect(dsn, registry=ActorRegistry()) as producer:
        smuggled = await producer.enqueue("billing.refund_all", {}, queue="sandbox")
        async with running_worker(dsn, registry, queues=["sandbox"]):
            await wait_for(lambda: terminal(producer, smuggled.job_id), timeout=20)
            await producer.requeue(smuggled.job_id)
            row = await wait_for(
                lambda: _ended_again(producer, smuggled.job_id), timeout=20
            )
    assert row.error_class == "ActorQueueMismatch" and row.status is JobStatus.FAILED
    assert ran == []


async def _ended_again(client: JobsClient, job_id: UUID) -> Any:
    row = await terminal(client, job_id)
    return row if row is not None and row.attempt >= 2 else None


# -- Django tasks ----------------------------------------------------------------------------------------

DJANGO_PROJECT = Path(__file__).resolve().parents[1] / "django_project"


def _django_env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    return env | {"DJANGO_SETTINGS_MODULE": "djsite.settings", "TASKQ_DJANGO_DSN": dsn, "TASKQ_DSN": dsn,
                  "PYTHONPATH": str(DJANGO_PROJECT)}


def test_django_task_actors_are_bound_to_their_backends_queues_and_names_import_nothing_new(dsn: str) -> None:
    probe = (
        "import json, sys\n"
        "from taskq.contrib.django.worker import actors\n"
        "add = actors.get('shop.tasks.add')\n"
        "seen = {'add': list(add.queues), 'nodb': list(actors.get('shop.tasks.elsewhere').queues),\n"
        "        'stranger': actors.get('antigravity.fly') is None and 'antigravity' not in sys.modules,\n"
        "        'not_a_task': actors.get('os.path.join') is None}\n"
        "print(json.dumps(seen))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=_django_env(dsn), capture_output=True, text=True,
                          timeout=120, cwd=DJANGO_PROJECT, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    # the default backend says QUEUES ["default", "other"]; the `nodb` one sets none (Django's default)
    assert seen == {"add": ["default", "other"], "nodb": ["default"], "stranger": True, "not_a_task": True}, seen


def _django_terminal(client: SyncJobsClient, job_id: UUID) -> Any:
    handle = client.get(job_id)
    assert handle is not None and handle.row is not None
    return handle.row if handle.row.is_terminal else None


@pytest.mark.slow
def test_a_django_task_put_in_a_queue_its_backend_does_not_serve_fails_without_running(dsn: str) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-m", "taskq.cli", "worker", "taskq.contrib.django.worker:actors", "--queues",
         "billing,other", "--poll-interval", "0.2"], env=_django_env(dsn), stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True, cwd=DJANGO_PROJECT,
    )
    try:
        with SyncJobsClient.connect(dsn, registry=ActorRegistry()) as producer:
            smuggled = producer.enqueue("shop.tasks.add", {"args": [1, 2], "kwargs": {}}, queue="billing")
            routed = producer.enqueue("shop.tasks.add", {"args": [3, 4], "kwargs": {}}, queue="other")
            row = wait_until(lambda: _django_terminal(producer, smuggled.job_id), timeout=90)
            ok = wait_until(lambda: _django_terminal(producer, routed.job_id), timeout=90)
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    assert (row.status, row.error_class) == (JobStatus.FAILED, "ActorQueueMismatch"), row
    assert "['default', 'other']" in (row.error_message or "")
    assert ok.status is JobStatus.SUCCEEDED and ok.result == 7, ok
