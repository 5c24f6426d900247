"""PgQueuer's side of `defaults.py`: runs only in a virtualenv of its own with `pgqueuer` and `asyncpg`
installed (PgQueuer is no dependency of taskq; nothing here is imported by taskq or its tests).

    PGDSN=... python benchmarks/pgqueuer_app.py worker       # a worker, PgQueuer's defaults
    PGDSN=... python benchmarks/pgqueuer_app.py install      # its schema, on a fresh database
    PGDSN=... python benchmarks/pgqueuer_app.py enqueue N    # a backlog of N no-op jobs
    PGDSN=... python benchmarks/pgqueuer_app.py produce      # enqueue.py's producer leg (commands on stdin)

The worker is what PgQueuer's documentation shows: one asyncpg connection, one entrypoint, run the way
`pgq run benchmarks.pgqueuer_app:main` runs it (its supervisor, on uvloop when installed), with every
option at its default (batch size 10, no concurrency cap, continuous mode). `pgq run` itself is not
used: in PgQueuer 1.6 with typer 0.29 its default `--log-level` fails before the worker starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

ENTRYPOINT = "bench_noop"
ENQUEUE_BATCH = 5_000


@contextlib.asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    connection = await asyncpg.connect(os.environ["PGDSN"])
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        return None

    try:
        yield pgq
    finally:
        await connection.close()


def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _produce(queries: Queries, pid: int) -> None:
    """enqueue.py's PgQueuer leg: each stdin line `BATCH SECONDS` enqueues jobs of BATCH (1: one
    `enqueue` call per job, else lists of BATCH) for SECONDS, the way its documentation shows, each job's
    payload the JSON of enqueue.py's; the answer is a line of JSON: jobs, seconds, this process's CPU and the
    serving backend's (from /proc: the server must be local)."""
    counter = 0
    for line in sys.stdin:
        batch, seconds = int(line.split()[0]), float(line.split()[1])
        jobs = 0
        cpu0, server0, t0 = time.process_time(), _backend_cpu(pid), time.perf_counter()
        deadline = t0 + seconds
        while time.perf_counter() < deadline:
            if batch == 1:
                counter += 1
                await queries.enqueue(ENTRYPOINT, json.dumps(_payload(counter)).encode(), 0)
            else:
                payloads = [json.dumps(_payload(counter + i)).encode() for i in range(batch)]
                counter += batch
                await queries.enqueue([ENTRYPOINT] * batch, payloads, [0] * batch)
            jobs += batch
        elapsed = time.perf_counter() - t0
        print(json.dumps({"jobs": jobs, "seconds": elapsed, "client_cpu_s": time.process_time() - cpu0,
                          "server_cpu_s": _backend_cpu(pid) - server0}), flush=True)


def _payload(i: int) -> dict[str, object]:
    # the same document as enqueue.py's _payload
    return {"url": f"s3://bucket/images/{i:08d}.png", "width": 640, "height": 480}


async def _admin(command: str, count: int) -> None:
    if command == "worker":
        from pgqueuer import run

        await run(main)
        return
    connection = await asyncpg.connect(os.environ["PGDSN"])
    try:
        queries = Queries(AsyncpgDriver(connection))
        if command == "install":
            await queries.install()
            return
        if command == "produce":
            await _produce(queries, int(await connection.fetchval("SELECT pg_backend_pid()")))
            return
        for first in range(0, count, ENQUEUE_BATCH):
            size = min(ENQUEUE_BATCH, count - first)
            await queries.enqueue([ENTRYPOINT] * size, [str(first + i).encode() for i in range(size)], [0] * size)
    finally:
        await connection.close()


if __name__ == "__main__":
    command = _admin(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    try:
        import uvloop
    except ImportError:
        asyncio.run(command)
    else:
        uvloop.run(command)
