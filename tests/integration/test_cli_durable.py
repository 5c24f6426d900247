"""The CLI of durable jobs: `taskq signal`, `taskq job` (steps, signals, what a suspended job waits for),
`taskq requeue --reset-steps` (issue 32)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_cli import ok, run_cli, user_error
from test_durable_steps import durable_registry, effects, row_of  # noqa: F401  (the fixture)
from testkit import running_worker, wait_for

from taskq import JobFailed, JobsClient

pytestmark = pytest.mark.timeout(90)


async def test_signal_wakes_a_waiting_job_and_job_shows_the_wait_steps_and_signals(dsn: str,
                                                                                 client: JobsClient) -> None:
    async with running_worker(dsn, durable_registry(dsn)):
        h = await client.enqueue("d.waiter", None)

        async def waiting() -> bool:
            row = await row_of(client, h.job_id)
            return row.status.value == "scheduled" and row.wait_kind == "signal" and row.attempt == 1

        await wait_for(waiting, timeout=20)
        shown = ok(run_cli("job", str(h.job_id), dsn=dsn))
        assert "scheduled (waiting for signal 'go' with no timeout)" in shown
        assert "go#1" in shown and "steps (1)" in shown
        out = ok(run_cli("signal", str(h.job_id), "go", "--payload", '{"n": 1}', dsn=dsn))
        assert "sent to job" in out and "due now" in out
        sent = json.loads(ok(run_cli("signal", str(h.job_id), "go", "--payload", "2", "--json", dsn=dsn)))
        assert sent["signal_id"] > 0
        assert (await h.wait(timeout=20)).result == [{"n": 1}, 2]
        detail = json.loads(ok(run_cli("job", str(h.job_id), "--json", dsn=dsn)))
        assert [s["consumed_by"] for s in detail["signals"]] == ["go#1", "go#2"]
        assert [s["name"] for s in detail["steps"]] == ["go#1", "go#2"]
        # errors: one line each
        assert "has ended (succeeded)" in user_error(run_cli("signal", str(h.job_id), "go", dsn=dsn), 2)
        user_error(run_cli("signal", "0192f000-0000-7000-8000-000000000000", "go", dsn=dsn), 4)
        for args, fragment in ((("", ), "must not be empty"), (("a\tb",), "control character"),
                               (("go", "--payload", "{nope"), "not JSON"),
                               (("x" * 201,), "the limit is 200")):
            assert fragment in user_error(run_cli("signal", str(h.job_id), *args, dsn=dsn), 2)


async def test_requeue_reset_steps_starts_the_rerun_over(dsn: str, client: JobsClient,
                                                        effects: Any) -> None:  # noqa: F811
    async with running_worker(dsn, durable_registry(dsn)):
        h = await client.enqueue("d.steps", 1, max_attempts=1)
        with pytest.raises(JobFailed):
            await h.wait(timeout=20)
        assert len(await client.steps(h.job_id)) == 2
        ok(run_cli("requeue", str(h.job_id), "--reset-steps", dsn=dsn))
        assert (await h.wait(timeout=20)).result == [2, {"n": 2}, 2]
        assert {s.attempt for s in await client.steps(h.job_id)} == {2}
