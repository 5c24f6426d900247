from __future__ import annotations

from taskq.client import JobsClient
from taskq.models import JobStatus


async def test_enqueue_then_cancel_pending_job_ends_cancelled_before_start(client: JobsClient) -> None:
    handle = await client.enqueue("some.actor", {"x": 1})
    result = await client.cancel(handle.job_id, reason="smoke")
    assert result.previous_status is JobStatus.PENDING
    assert result.new_status is JobStatus.CANCELLED
    assert result.cancellation_initiated is True
    fetched = await client.get(handle.job_id)
    assert fetched is not None and fetched.row is not None
    assert fetched.row.error_class == "CancelledBeforeStart"
