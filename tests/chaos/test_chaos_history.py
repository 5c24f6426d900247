"""The history checks (chaos_history.py) can fail: a lost enqueue, a reverted terminal write, a re-run after a
terminal state the producer saw, and two executions of one claim are each named; --expect-loss tolerates the
first three and not the last; the producer writes a job whose enqueue had an unknown outcome again only once a
lookup said it is absent. An in-process worker on the shared test server, a few seconds."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from apps import taskq_chaos_app
from chaos_history import History, check_history, corrupt_history
from chaos_history import now as history_now
from testkit import query, running_worker, wait_for

from taskq import JobsClient


async def _run_and_watch(dsn: str, client: JobsClient, history: History, works: list[dict[str, Any]]) -> list[UUID]:
    """Enqueue `works` on chaos.async as the chaos producer does (each acknowledged call in the history),
    and poll until the producer has seen every job terminal."""
    ids = []
    for work in works:
        sent = history_now()
        handle = await client.enqueue("chaos.async", work, max_attempts=1)
        history.enqueued("enqueue", [(handle.job_id, work["key"], None)], sent)
        ids.append(handle.job_id)

    async def all_seen() -> bool:
        await history.poll_once()
        return {s.job_id for s in history.seen} >= set(ids)

    await wait_for(all_seen, timeout=20, interval=0.1)
    return ids


async def test_history_checks_pass_on_a_clean_run_and_count_a_recorded_requeue_as_no_rerun(
    effects_dsn: str, client: JobsClient
) -> None:
    history = History(effects_dsn, effects_dsn, run_id="")
    async with running_worker(effects_dsn, taskq_chaos_app.actors):
        ids = await _run_and_watch(effects_dsn, client, history,
                                   [{"key": "ok-0"}, {"key": "ok-1"}, {"key": "fails", "always_fail": True}])
        sent = history_now()
        await client.requeue(ids[2], attempts=1, reason="operator")
        history.record("requeue", "ok", sent, job_id=ids[2])
        await wait_for(lambda: query(effects_dsn, "SELECT 1 FROM taskq.jobs WHERE id = %s AND attempt = 2 "
                                                  "AND status = 'failed'", ids[2]), timeout=20)
    result = await check_history(history)
    assert result.violations == {}, result.render(False)
    assert result.figures["acknowledged enqueues (jobs)"] == 3


async def test_history_checks_name_a_lost_enqueue_a_reverted_terminal_write_and_a_rerun(
    effects_dsn: str, client: JobsClient
) -> None:
    history = History(effects_dsn, effects_dsn, run_id="")
    async with running_worker(effects_dsn, taskq_chaos_app.actors):
        ids = await _run_and_watch(effects_dsn, client, history,
                                   [{"key": "lost"}, {"key": "reverted"}, {"key": "rerun", "always_fail": True}])
        # a re-run nobody recorded: what a failover that lost the terminal write looks like to the history
        await client.requeue(ids[2], attempts=1)
        await wait_for(lambda: query(effects_dsn, "SELECT 1 FROM chaos.effects WHERE job_id = %s AND attempt = 2",
                                     ids[2]), timeout=20)
    assert "deleted" in await corrupt_history(effects_dsn, history, "delete")
    query(effects_dsn, "UPDATE taskq.jobs SET status = 'pending', finished_at = NULL, result = NULL, "
                       "revision = revision + 1 WHERE id = %s", ids[1])
    result = await check_history(history)
    assert [d.split(":")[0] for d in result.violations["I1_missing"]] == [str(ids[0])], result.render(False)
    assert {d.split(":")[0] for d in result.violations["I2_reverted"]} == {str(i) for i in ids}, result.render(False)
    assert [d.split(":")[0] for d in result.violations["I2_rerun"]] == [str(ids[2])], result.render(False)
    assert "I3_claim" not in result.violations and "I3_stale" not in result.violations, result.render(False)
    assert result.failing(expect_loss=False) == 5
    assert result.failing(expect_loss=True) == 0  # the asynchronous leg: reported, not failed


async def test_history_checks_name_two_executions_of_one_claim_even_when_losses_are_expected(
    effects_dsn: str, client: JobsClient
) -> None:
    history = History(effects_dsn, effects_dsn, run_id="")
    async with running_worker(effects_dsn, taskq_chaos_app.actors):
        ids = await _run_and_watch(effects_dsn, client, history, [{"key": "twice"}])
    # a second execution of the same claim on the same worker: a stale claim let through
    columns = "job_id, attempt, claim_epoch, actor, isolation, pid, run, worker, began_at"
    query(effects_dsn, f"INSERT INTO chaos.effects ({columns}, token) SELECT {columns}, gen_random_uuid() "
                       "FROM chaos.effects WHERE job_id = %s", ids[0])
    result = await check_history(history)
    assert len(result.violations["I3_claim"]) == 1, result.render(True)
    assert result.failing(expect_loss=True) == 1


async def test_an_enqueue_of_unknown_outcome_is_written_again_only_after_a_lookup_answered(
    effects_dsn: str, client: JobsClient, monkeypatch: Any
) -> None:
    # a failover's pattern: the write commits, its reply is lost, and for a while no server answers the
    # lookup either; writing again before a lookup answered wrote the job twice (CI's sync drill)
    import chaos
    from chaos_checks import Planned
    from chaos_checks import fetch as real_fetch

    planned = Planned("k-unknown", "chaos.async", {"key": "k-unknown"}, 0.0)
    workload = chaos.Workload(client, effects_dsn, [planned], History(effects_dsn, effects_dsn, run_id=""))
    lookups: list[str] = []
    writes: list[int] = []

    async def failing_fetch(dsn: str, text: str, *params: Any) -> list[tuple[Any, ...]]:
        lookups.append(text)
        if len(lookups) <= 3:  # no primary yet
            raise OSError("connection refused")
        return await real_fetch(dsn, text, *params)

    async def write() -> list[UUID]:
        writes.append(1)
        handle = await client.enqueue("chaos.async", planned.work)
        if len(writes) == 1:
            raise OSError("server closed the connection unexpectedly")  # after the commit
        return [handle.job_id]

    monkeypatch.setattr(chaos, "fetch", failing_fetch)
    await workload._write_retrying([planned], write, "enqueue")
    rows = query(effects_dsn, "SELECT id FROM taskq.jobs WHERE payload->>'key' = 'k-unknown'")
    assert len(writes) == 1 and len(lookups) == 4, (writes, lookups)
    assert [r[0] for r in rows] == [planned.job_id], rows
    assert planned.via == "written, then the connection broke" and planned.error is None
