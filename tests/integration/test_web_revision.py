"""A job's revision with a real worker: it rises with the claim, a progress checkpoint, the cancel request
and the cancelled verdict, and not with heartbeats; the API's 202 for a running job is followed by the
worker's cancel, and the job's timeline shows the operator's entry."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from uuid import UUID

import httpx
import pytest
from testkit import WebServer, query, running_worker, wait_for

from taskq import JobContext, actor
from taskq.backend import Backend
from taskq.ops.tokens import create_token


@actor(name="web.revision.progress")
async def report_then_wait(payload: int, ctx: JobContext[int]) -> int:
    await ctx.progress({"step": 1})
    await ctx.cancel_event.wait()
    raise asyncio.CancelledError


@pytest.fixture
def server(dsn: str, tmp_path: Path) -> Iterator[WebServer]:
    web = WebServer(dsn, log_path=tmp_path / "web.log")
    try:
        yield web
    finally:
        web.stop()


def revision(dsn: str, jid: UUID) -> int:
    return int(query(dsn, "SELECT revision FROM taskq.jobs WHERE id = %s", jid)[0][0])


async def test_revision_follows_changes_of_the_row_but_not_heartbeats(dsn: str, server: WebServer) -> None:
    backend = await Backend.open(dsn)
    try:
        _, token = await create_token(backend, "ops", ["*@*"])
    finally:
        await backend.close()
    async with httpx.AsyncClient(base_url=server.url + "/api/v1", timeout=30,
                                 headers={"Authorization": f"Bearer {token}"}) as api:
        made = await api.post("/jobs", json={"actor": "web.revision.progress", "payload": 1})
        assert made.status_code == 201 and made.json()["job"]["revision"] == 1
        jid = UUID(made.json()["job"]["id"])
        async with running_worker(dsn, [report_then_wait]) as worker:
            # the claim (+1) and the progress checkpoint (+1)
            await wait_for(lambda: query(dsn, "SELECT progress IS NOT NULL FROM taskq.jobs WHERE id = %s", jid)[0][0])
            assert revision(dsn, jid) == 3
            beats = query(dsn, "SELECT last_heartbeat_at FROM taskq.workers WHERE id = %s", worker.worker_id)[0][0]
            await wait_for(lambda: query(dsn, "SELECT last_heartbeat_at > %s + interval '0.5 s' FROM taskq.workers"
                                              " WHERE id = %s", beats, worker.worker_id)[0][0])
            assert revision(dsn, jid) == 3  # several heartbeats later: unchanged
            (seen,) = (await api.get("/workers")).json()["workers"]
            assert seen["id"] == worker.worker_id and seen["held"] == 1 and 0 <= seen["heartbeat_age"] < 5
            assert [h["id"] for h in seen["held_jobs"]] == [str(jid)]
            cancel = await api.post(f"/jobs/{jid}:cancel", json={"expected_revision": 3, "reason": "enough"})
            assert cancel.status_code == 202, cancel.text
            assert cancel.json()["job"]["cancel_phase"] == 1 and cancel.json()["job"]["revision"] == 4

            async def cancelled() -> bool:
                return bool((await api.get(f"/jobs/{jid}")).json()["job"]["status"] == "cancelled")

            await wait_for(cancelled, timeout=20)
        detail = (await api.get(f"/jobs/{jid}")).json()
    assert detail["job"]["revision"] >= 5 and detail["job"]["error_class"] == "CancelledCooperatively"
    # enqueued (the API's audit entry), claimed, cancel requested (and its audit entry), cancelled
    assert [e["kind"] for e in detail["events"]] == [
        "operator", "state_change", "cancel_requested", "operator", "state_change"]
    assert [(a["action"], a["outcome"]) for a in detail["audit"]] == [
        ("jobs:enqueue", "enqueued"), ("jobs:cancel", "cancel_requested")]
