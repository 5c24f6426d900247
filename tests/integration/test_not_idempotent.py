"""`@actor(idempotent=False)`: the fact is on the job row from the enqueue when the producer knows the actor,
so a reclaimer that does not know it (another APP, the supervisor) still never retries it blindly."""

from __future__ import annotations

import pytest

from taskq import JobContext, JobsClient
from taskq.actors.declaration import ActorRegistry, actor
from taskq.exceptions import ActorDefinitionError

pytestmark = pytest.mark.timeout(60)


async def test_enqueue_writes_the_flag_when_the_producer_knows_the_actor(dsn: str) -> None:
    reg = ActorRegistry()

    @actor(name="pay.charge", registry=reg, idempotent=False)
    async def charge(payload: int, ctx: JobContext[int]) -> int:
        return payload

    @actor(name="pay.receipt", registry=reg)
    async def receipt(payload: int, ctx: JobContext[int]) -> int:
        return payload

    async with await JobsClient.connect(dsn, registry=reg) as client:
        one = await client.enqueue(charge, 1)
        by_name = await client.enqueue("pay.charge", 2)
        many = await client.enqueue_many(charge, [3, 4])
        plain = await client.enqueue(receipt, 5)
        unknown = await client.enqueue("pay.elsewhere", 6)
        assert one.row is not None and one.row.idempotent is False
        for handle in (one, by_name, *many):
            stored = await client.get(handle.job_id)
            assert stored is not None and stored.row is not None and stored.row.idempotent is False
        for handle in (plain, unknown):
            stored = await client.get(handle.job_id)
            assert stored is not None and stored.row is not None and stored.row.idempotent is True


def test_idempotent_must_be_a_bool() -> None:
    with pytest.raises(ActorDefinitionError, match="idempotent"):

        @actor(name="pay.bad", registry=ActorRegistry(), idempotent="no")  # type: ignore[call-overload, untyped-decorator]
        async def bad(payload: int) -> int:
            return payload


def test_the_supervisor_reclaim_ends_a_non_idempotent_job_crashed_without_knowing_the_actor(dsn: str) -> None:
    from testkit import query

    from taskq.backend.supervisor import reclaim_dead_worker

    rows = {}
    for idempotent in (True, False):
        (row,) = query(dsn, "INSERT INTO taskq.jobs (actor, status, attempt, claim_epoch, worker_id, started_at, "
                            "lock_expires_at, max_attempts, idempotent) VALUES ('elsewhere.pay', 'running', 1, 1, "
                            "'dead', now(), now() + interval '1 hour', 5, %s) RETURNING id", idempotent)
        query(dsn, "INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id) VALUES (%s, 1, 1, 'dead')",
              row[0])
        rows[idempotent] = row[0]
    counts = reclaim_dead_worker(dsn, "dead", cause="worker_died", detail="exited -9", reclaimer_id="supervisor:t")
    assert counts == {"scheduled": 1, "crashed": 1}
    (crashed,) = query(dsn, "SELECT status, error_class, attempt, max_attempts, error_message FROM taskq.jobs "
                            "WHERE id = %s", rows[False])
    assert crashed[:4] == ("crashed", "WorkerCrashed", 1, 5) and "not idempotent" in crashed[4]
    (event,) = query(dsn, "SELECT detail FROM taskq.job_events WHERE job_id = %s", rows[False])
    assert event[0]["idempotent"] is False
    assert query(dsn, "SELECT status FROM taskq.jobs WHERE id = %s", rows[True]) == [("scheduled",)]
