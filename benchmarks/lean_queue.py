"""The lean loop: a queue a team would write by hand with psycopg, the floor taskq is compared with by
enqueue.py (producers) and latency.py (enqueue -> start).

    python benchmarks/lean_queue.py worker DSN     # the lean worker latency.py starts

One table (id bigint identity, queue, payload jsonb, status, priority, scheduled_at, created_at, result)
with its primary key and one partial claim index. The producer writes one job per commit with a prepared
INSERT that notifies in the same statement. The worker LISTENs on `lean_jobs` and, woken (or every
second), claims up to 10 jobs with one UPDATE ... FOR UPDATE SKIP LOCKED, "starts" each (takes
time.time(), as taskq's stamp actor does) and writes it done with that time as its result, in one more
statement: no leases, attempts, events, fences or hooks, which is what makes it the floor.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import psycopg

SCHEMA = (
    "CREATE SCHEMA IF NOT EXISTS lean",
    "CREATE TABLE lean.jobs (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, queue text NOT NULL,"
    " payload jsonb NOT NULL, status text NOT NULL DEFAULT 'pending', priority int NOT NULL DEFAULT 0,"
    " scheduled_at timestamptz NOT NULL DEFAULT now(), created_at timestamptz NOT NULL DEFAULT now(), result jsonb)",
    "CREATE INDEX lean_claim_idx ON lean.jobs (queue, priority, scheduled_at, id) WHERE status = 'pending'",
)
INSERT = "INSERT INTO lean.jobs (queue, payload) VALUES (%s, %s::jsonb)"
INSERT_MANY = "INSERT INTO lean.jobs (queue, payload) SELECT %s, p::jsonb FROM unnest(%b::text[]) AS p"
INSERT_NOTIFY = ("WITH j AS (INSERT INTO lean.jobs (queue, payload) VALUES (%s, %s::jsonb) RETURNING id)"
                 " SELECT id, pg_notify('lean_jobs', '') FROM j")
CLAIM = ("UPDATE lean.jobs SET status = 'running' WHERE id IN (SELECT id FROM lean.jobs WHERE status = 'pending'"
         " AND queue = 'default' AND scheduled_at <= now() ORDER BY priority, scheduled_at, id LIMIT 10"
         " FOR UPDATE SKIP LOCKED) RETURNING id, payload")
DONE = ("UPDATE lean.jobs AS j SET status = 'done', result = to_jsonb(d.started) FROM unnest(%s::bigint[],"
        " %s::float8[]) AS d(id, started) WHERE j.id = d.id")


def create(conn: psycopg.Connection[Any]) -> None:
    for statement in SCHEMA:
        conn.execute(statement)


async def worker(dsn: str) -> None:
    """Claim, start and finish jobs until killed; wake on NOTIFY, else every second."""
    listen = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    work = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    await listen.execute("LISTEN lean_jobs")
    print("listening", flush=True)
    while True:
        cur = await work.execute(CLAIM, prepare=True)
        rows = await cur.fetchall()
        if rows:
            started = [time.time() for _ in rows]
            await work.execute(DONE, ([r[0] for r in rows], started), prepare=True)
            continue
        async for _ in listen.notifies(timeout=1.0, stop_after=1):
            pass


if __name__ == "__main__":
    if sys.argv[1:2] != ["worker"] or len(sys.argv) != 3:
        raise SystemExit("usage: lean_queue.py worker DSN")
    import uvloop

    uvloop.run(worker(sys.argv[2]))
