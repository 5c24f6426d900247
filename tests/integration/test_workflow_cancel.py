"""Workflow ids and cancelling a whole workflow (issue 32, item 5), against a real PostgreSQL, real
in-process workers and real process actors (whose children get real signals)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from uuid import UUID, uuid4

import psycopg
import pytest
from apps import taskq_isolation_app as app
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFilter, JobsClient, WorkflowCancelResult, WorkflowNotFound
from taskq.actors.declaration import ActorRegistry, actor
from taskq.client_sync import SyncJobsClient
from taskq.exceptions import ConfigurationError
from taskq.invariants import check_invariants
from taskq.models import JobStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

IDLE = "wf.idle"
"""A queue no test worker serves: its jobs stay pending."""


def workflow_registry() -> ActorRegistry:
    reg = ActorRegistry(app.actors)

    @actor(name="wfc.quick", registry=reg, queues=["default", IDLE])
    async def quick(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="wfc.spawner", registry=reg)
    async def spawner(payload: int, ctx: JobContext[int]) -> int:
        await ctx.jobs.enqueue("wfc.quick", payload + 1)
        await ctx.jobs.enqueue("wfc.quick", payload + 2, queue=IDLE)
        return payload

    @actor(name="wfc.cooperative", registry=reg)
    async def cooperative(payload: int, ctx: JobContext[int]) -> int:
        await ctx.progress({"running": True}, message="started")
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError

    @actor(name="wfc.sleeper", registry=reg)
    async def sleeper(payload: int, ctx: JobContext[int]) -> int:
        await ctx.sleep(3600)  # suspended: no worker, no lease
        return payload

    @actor(name="wfc.waiter", registry=reg)
    async def waiter(payload: int, ctx: JobContext[int]) -> int:
        await ctx.wait_for_signal("go")  # suspended until a signal that never comes
        return payload

    return reg


async def suspended(client: JobsClient, job_id: UUID, kind: str) -> None:
    async def waits() -> bool:
        row = await client.backend.get(job_id)
        return row is not None and row.status == JobStatus.SCHEDULED and row.wait_kind == kind

    await wait_for(waits, timeout=20)


async def assert_invariants_hold(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        report = await check_invariants(conn, stale_after=0)
    assert report.violations == [], report.render()


def workflow_of(dsn: str, job_id: UUID) -> UUID | None:
    found = query(dsn, "SELECT workflow_id FROM taskq.jobs WHERE id = %s", job_id)[0][0]
    return found if found is None else UUID(str(found))


async def started(client: JobsClient, job_id: UUID) -> None:
    async def ran() -> bool:
        row = await client.backend.get(job_id)
        return row is not None and row.progress is not None and row.progress.get("message") == "started"

    await wait_for(ran, timeout=20)


# -- workflow ids -------------------------------------------------------------------------------------


async def test_workflow_id_is_known_in_the_block_and_every_member_and_ctx_child_carries_it(
    dsn: str, client: JobsClient
) -> None:
    reg = workflow_registry()
    client.registry = reg
    async with client.workflow() as wf:
        wid = wf.id
        first = wf.enqueue("wfc.spawner", 10)
        second = wf.enqueue("wfc.quick", 1, depends_on=[first])
    assert client.workflow().id != wid and wid.version == 7
    outsider = await client.enqueue("wfc.quick", 0, queue=IDLE)
    joined = await client.enqueue("wfc.quick", 5, queue=IDLE, workflow_id=str(wid))
    async with running_worker(dsn, reg):
        await first.handle.wait(timeout=20)
        await second.handle.wait(timeout=20)
    children = query(dsn, "SELECT id, workflow_id, parent_id FROM taskq.jobs WHERE parent_id = %s",
                     first.job_id)
    assert len(children) == 2
    assert {UUID(str(c[1])) for c in children} == {wid}
    assert workflow_of(dsn, first.job_id) == wid and workflow_of(dsn, second.job_id) == wid
    assert workflow_of(dsn, joined.job_id) == wid and workflow_of(dsn, outsider.job_id) is None
    assert second.handle.row is not None and second.handle.row.workflow_id == wid
    listed = await client.list_jobs(JobFilter(workflow_id=wid))
    assert {r.id for r in listed} == {first.job_id, second.job_id, joined.job_id} | {c[0] for c in children}


async def test_workflow_enqueue_refuses_another_workflow_id(client: JobsClient) -> None:
    async with client.workflow() as wf:
        wf.enqueue("wfc.quick", 1, queue=IDLE, workflow_id=wf.id)
        with pytest.raises(ConfigurationError, match="another workflow"):
            wf.enqueue("wfc.quick", 1, queue=IDLE, workflow_id=uuid4())
    with pytest.raises(ConfigurationError, match="not a workflow id"):
        await client.enqueue("wfc.quick", 1, queue=IDLE, workflow_id="nope")


# -- cancel_workflow ----------------------------------------------------------------------------------


@dataclass
class MixedWorkflow:
    """A workflow with a member of each kind cancel_workflow tells apart; `expected` is the count each kind adds
    to a WorkflowCancelResult, and `final` the (status, error_class) each member must end with."""

    id: UUID
    members: dict[str, UUID] = field(default_factory=dict)
    final: dict[str, tuple[JobStatus, str | None]] = field(default_factory=dict)
    expected: dict[str, int] = field(default_factory=lambda: {
        "cancelled": 0, "suspended": 0, "cancel_requested": 0, "already_cancelling": 0, "already_ended": 0})


async def build_mixed_workflow(client: JobsClient) -> MixedWorkflow:
    """pending, scheduled (in an hour), two awaiting_parents (behind the running ones), one already succeeded,
    a running async member that cooperates, and a running process member that ignores every cancel (it ignores
    SIGTERM too: only SIGKILL stops it, and the job ends abandoned). A worker must serve 'default'."""
    async with client.workflow() as wf:
        done = wf.enqueue("wfc.quick", 1)
        coop = wf.enqueue("wfc.cooperative", 2)
        deaf = wf.enqueue("iso.proc.deaf", {"seconds": 60})
        pending = wf.enqueue("wfc.quick", 3, queue=IDLE)
        later = wf.enqueue("wfc.quick", 4, scheduled_at=timedelta(hours=1))
        behind_coop = wf.enqueue("wfc.quick", 5, depends_on=[coop])
        behind_both = wf.enqueue("wfc.quick", 6, depends_on=[coop, deaf], dependency_mode="on_any_terminal")
        sleeping = wf.enqueue("wfc.sleeper", 7)
        signal_waiting = wf.enqueue("wfc.waiter", 8)
    mixed = MixedWorkflow(wf.id)
    mixed.members = {"done": done.job_id, "coop": coop.job_id, "deaf": deaf.job_id, "pending": pending.job_id,
                     "later": later.job_id, "behind_coop": behind_coop.job_id, "behind_both": behind_both.job_id,
                     "sleeping": sleeping.job_id, "signal_waiting": signal_waiting.job_id}
    await done.handle.wait(timeout=20)
    await started(client, coop.job_id)
    await started(client, deaf.job_id)
    await suspended(client, sleeping.job_id, "sleep")
    await suspended(client, signal_waiting.job_id, "signal")
    mixed.expected.update(cancelled=6, suspended=2, cancel_requested=2, already_ended=1)
    waiting = (JobStatus.CANCELLED, "CancelledBeforeStart")
    mixed.final = {"done": (JobStatus.SUCCEEDED, None), "coop": (JobStatus.CANCELLED, "CancelledCooperatively"),
                   "deaf": (JobStatus.ABANDONED, "CancelAbandoned"), "pending": waiting, "later": waiting,
                   "behind_coop": waiting, "behind_both": waiting, "sleeping": waiting, "signal_waiting": waiting}
    return mixed


async def test_cancel_workflow_ends_every_member_and_counts_each_outcome(dsn: str, client: JobsClient) -> None:
    """A running cooperative async member, a stubborn process member that ignores every cancel, a sleeping and a
    signal-waiting member, two members awaiting parents, a pending and a scheduled one: all end, with the
    markers of the cancellation spec, and the counts returned match."""
    reg = workflow_registry()
    client.registry = reg
    async with running_worker(dsn, reg, max_children=2):
        mixed = await build_mixed_workflow(client)
        result = await client.cancel_workflow(mixed.id, reason="customer left")
        assert isinstance(result, WorkflowCancelResult)
        counts = result.model_dump(include=set(mixed.expected))
        assert counts == mixed.expected
        assert result.members == len(mixed.members)
        assert set(result.job_ids) == set(mixed.members.values()) - {mixed.members["done"]}

        async def all_ended() -> bool:
            rows = await client.list_jobs(JobFilter(workflow_id=mixed.id))
            return all(r.is_terminal for r in rows)

        await wait_for(all_ended, timeout=30)
        again = await client.cancel_workflow(str(mixed.id))
    assert (again.already_ended, again.cancelled, again.cancel_requested, again.job_ids) == (
        len(mixed.members), 0, 0, ())
    for name, job_id in mixed.members.items():
        row = await client.backend.get(job_id)
        assert row is not None
        assert (row.status, row.error_class) == mixed.final[name], name
        if name != "done":
            assert row.cancel_reason == "customer left", name
            events = await client.events(job_id)
            first = next(e for e in events if e.kind in ("cancel_requested", "state_change")
                         and e.detail.get("origin") == "operator")
            assert first.detail["workflow_id"] == str(mixed.id), name
    await assert_invariants_hold(dsn)


async def test_cancel_workflow_while_a_cancel_is_in_flight_counts_it_apart(dsn: str, client: JobsClient) -> None:
    reg = workflow_registry()
    client.registry = reg
    async with running_worker(dsn, reg, max_children=1, cancellation_grace_period=1.0, cleanup_grace_period=1.0):
        async with client.workflow() as wf:
            deaf = wf.enqueue("iso.proc.deaf", {"seconds": 60})
            wf.enqueue("wfc.quick", 1, queue=IDLE)
        await started(client, deaf.job_id)
        await client.cancel(deaf.job_id, reason="by hand")
        result = await client.cancel_workflow(wf.id)
        assert (result.cancelled, result.cancel_requested, result.already_cancelling, result.already_ended) == (
            1, 0, 1, 0)
        await deaf.handle.refresh()
        assert deaf.handle.row is not None and deaf.handle.row.cancel_reason == "by hand"
        rows = await client.list_jobs(JobFilter(workflow_id=wf.id, statuses=(JobStatus.CANCELLED,)))
        assert [r.cancel_reason for r in rows] == [f"workflow-cancel:{wf.id}"]
        # the worker's shutdown must not meet the child that ignores SIGTERM: let the ladder end it first
        with pytest.raises(Exception, match="abandoned"):
            await deaf.handle.wait(timeout=20)


async def test_cancel_workflow_of_an_unknown_or_bad_id_is_a_clear_error(client: JobsClient) -> None:
    unknown = uuid4()
    with pytest.raises(WorkflowNotFound, match=str(unknown)) as raised:
        await client.cancel_workflow(unknown)
    assert isinstance(raised.value, KeyError)
    with pytest.raises(ConfigurationError, match="not a workflow id"):
        await client.cancel_workflow("not-a-uuid")
    with pytest.raises(ConfigurationError, match="not a workflow id"):
        await client.cancel_workflow(42)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="reason"):
        await client.cancel_workflow(unknown, reason="x" * 10_001)


async def test_job_filter_workflow_id_selects_members_in_cancel_where_and_list(client: JobsClient) -> None:
    async with client.workflow() as wf:
        a = wf.enqueue("wfc.quick", 1, queue=IDLE)
        b = wf.enqueue("wfc.quick", 2, queue=IDLE, depends_on=[a])
    stranger = await client.enqueue("wfc.quick", 3, queue=IDLE)
    listed = await client.list_jobs(JobFilter(workflow_id=wf.id))
    assert {r.id for r in listed} == {a.job_id, b.job_id}
    bulk = await client.cancel_where(JobFilter(workflow_id=wf.id))
    assert set(bulk.job_ids) == {a.job_id, b.job_id}
    row = await client.backend.get(stranger.job_id)
    assert row is not None and row.status is JobStatus.PENDING
    assert not JobFilter(workflow_id=wf.id).is_empty


def test_sync_client_cancels_a_workflow(dsn: str) -> None:
    with SyncJobsClient.connect(dsn) as client:
        with client.workflow() as wf:
            job = wf.enqueue("wfc.quick", 1, queue=IDLE)
        result = client.cancel_workflow(wf.id, reason="sync")
        assert (result.cancelled, result.members, result.job_ids) == (1, 1, (job.job_id,))
        with pytest.raises(WorkflowNotFound):
            client.cancel_workflow(uuid4())


def run_cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")} | {"TASKQ_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


async def test_cli_lists_and_cancels_a_workflow_and_audits_it(dsn: str, client: JobsClient) -> None:
    async with client.workflow() as wf:
        a = wf.enqueue("wfc.quick", 1, queue=IDLE)
        wf.enqueue("wfc.quick", 2, queue=IDLE, depends_on=[a])
    listed = run_cli(dsn, "jobs", "--workflow", str(wf.id), "--json")
    assert listed.returncode == 0, listed.stderr
    assert len(json.loads(listed.stdout)) == 2
    done = run_cli(dsn, "cancel", "--workflow", str(wf.id), "--reason", "cli")
    assert done.returncode == 0, done.stderr
    assert f"workflow {wf.id}" in done.stdout and "cancelled (were waiting)" in done.stdout
    as_json = run_cli(dsn, "cancel", "--workflow", str(wf.id), "--json")
    assert json.loads(as_json.stdout)["already_ended"] == 2
    audit = query(dsn, "SELECT action, outcome, detail->>'workflow_id' FROM taskq.operator_audit ORDER BY id")
    assert audit == [("jobs:cancel", "cancelled", str(wf.id)), ("jobs:cancel", "unchanged", str(wf.id))]
    unknown = run_cli(dsn, "cancel", "--workflow", str(uuid4()))
    assert unknown.returncode == 4 and unknown.stderr.count("\n") == 1 and "no job belongs" in unknown.stderr
