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

        @actor(name="pay.bad", registry=ActorRegistry(), idempotent="no")  # type: ignore[call-overload]
        async def bad(payload: int) -> int:
            return payload
