"""The client and an in-process worker with every connection through a real PgBouncer in transaction mode."""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from testkit import query, running_worker, wait_for

from taskq import JobContext, JobFilter, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.exceptions import JobFailed
from taskq.models import JobStatus

pytestmark = pytest.mark.timeout(90)


def test_the_pooler_is_a_pgbouncer_that_refuses_startup_options(pooled_dsn: str) -> None:
    # what a worker of schema 2 sent: PgBouncer turns the connection away before any query
    with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter: options"):
        psycopg.connect(pooled_dsn + " options='-c taskq.worker_id=w1'", connect_timeout=5).close()


async def test_the_client_enqueues_waits_lists_and_cancels_through_pgbouncer(dsn: str, pooled_dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="pooled.double", registry=reg)
    async def double(payload: int) -> int:
        return payload * 2

    # many more executions of each statement than psycopg's prepare threshold (5), on a pool of two
    async with await JobsClient.connect(pooled_dsn, registry=reg, transaction_pooler=True, max_size=2) as client:
        handles = [await client.enqueue(double, i, tags=("pooled",)) for i in range(30)]
        handles += await client.enqueue_many(double, list(range(30, 60)), tags=("pooled",))
        for handle in handles[:10]:
            assert (await client.get(handle.job_id)) is not None
        assert len(await client.list_jobs(JobFilter(tags=("pooled",)), limit=100)) == 60
        first = await client.cancel(handles[0].job_id, reason="one")
        assert first.new_status is JobStatus.CANCELLED
        bulk = await client.cancel_where(JobFilter(tags=("pooled",), unfinished=True), reason="rest")
        assert bulk.total == 59
        with pytest.raises(JobFailed):
            await handles[1].wait(timeout=10)


async def test_the_transaction_pooler_setting_comes_from_the_environment_for_clients(
    pooled_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TASKQ_TRANSACTION_POOLER", "1")
    async with await JobsClient.connect(pooled_dsn, max_size=1) as client:
        async with client.backend.pool.connection() as conn:
            assert conn.prepare_threshold is None
    monkeypatch.delenv("TASKQ_TRANSACTION_POOLER")
    async with await JobsClient.connect(pooled_dsn, max_size=1) as client:
        async with client.backend.pool.connection() as conn:
            assert conn.prepare_threshold == 5


async def test_a_worker_through_pgbouncer_runs_jobs_and_knows_its_own_writes(dsn: str, pooled_dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="pooled.square", registry=reg)
    async def square(payload: int) -> int:
        return payload * payload

    # every lease-loss row, kept: the worker's heartbeat deletes its own on its next tick
    query(dsn, "CREATE TABLE public.losses_seen (job_id uuid)")
    query(dsn, "CREATE FUNCTION public.keep_loss() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
               "INSERT INTO public.losses_seen VALUES (NEW.job_id); RETURN NULL; END $$")
    query(dsn, "CREATE TRIGGER keep AFTER INSERT ON taskq.lease_losses FOR EACH ROW "
               "EXECUTE FUNCTION public.keep_loss()")
    async with await JobsClient.connect(pooled_dsn, registry=reg, transaction_pooler=True) as client:
        async with running_worker(pooled_dsn, reg, transaction_pooler=True, concurrency=20) as worker:
            handles = await client.enqueue_many(square, list(range(200)))
            for i, handle in enumerate(handles):
                assert (await handle.wait(timeout=30)).result == i * i
            assert not worker.parts.listener.connected.is_set()  # no LISTEN through the pooler
    # the finishes were the worker's own writes: the lease-loss trigger read its name through the pooler
    assert query(dsn, "SELECT count(*) FROM public.losses_seen") == [(0,)]
    workers = query(dsn, "SELECT DISTINCT worker_id FROM taskq.job_attempts")
    assert len(workers) == 1


async def test_a_cancel_reaches_a_running_job_through_pgbouncer_by_the_heartbeat(pooled_dsn: str) -> None:
    reg = ActorRegistry()
    started = asyncio.Event()

    @actor(name="pooled.wait", registry=reg)
    async def wait_for_cancel(payload: int, ctx: JobContext[int]) -> int:
        started.set()
        await ctx.cancel_event.wait()
        raise asyncio.CancelledError  # acknowledges the request

    async with await JobsClient.connect(pooled_dsn, registry=reg, transaction_pooler=True) as client:
        async with running_worker(pooled_dsn, reg, transaction_pooler=True):
            handle = await client.enqueue(wait_for_cancel, 1)
            await asyncio.wait_for(started.wait(), 20)
            result = await client.cancel(handle.job_id, reason="through the pooler")
            assert result.new_status is JobStatus.RUNNING and result.cancellation_initiated
            with pytest.raises(JobFailed):
                await handle.wait(timeout=20)
            row = await handle.refresh()
    assert row.status is JobStatus.CANCELLED
    assert row.error_class == "CancelledCooperatively"


async def test_a_worker_through_pgbouncer_listens_on_its_listen_dsn(dsn: str, pooled_dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="pooled.echo", registry=reg)
    async def echo(payload: int) -> int:
        return payload

    async with await JobsClient.connect(pooled_dsn, registry=reg, transaction_pooler=True) as client:
        # a long poll: a job that starts at once was woken by the NOTIFY on the direct LISTEN connection
        async with running_worker(pooled_dsn, reg, transaction_pooler=True, listen_dsn=dsn,
                                  poll_interval=30.0) as worker:
            await wait_for(worker.parts.listener.connected.is_set)
            handle = await client.enqueue(echo, 7)
            assert (await handle.wait(timeout=10)).result == 7
