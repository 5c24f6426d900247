"""PgQueuer's side of `defaults.py`: runs only in a virtualenv of its own with `pgqueuer` and `asyncpg`
installed (PgQueuer is no dependency of taskq; nothing here is imported by taskq or its tests).

    PGDSN=... python benchmarks/pgqueuer_app.py worker       # a worker, PgQueuer's defaults
    PGDSN=... python benchmarks/pgqueuer_app.py install      # its schema, on a fresh database
    PGDSN=... python benchmarks/pgqueuer_app.py enqueue N    # a backlog of N no-op jobs

The worker is what PgQueuer's documentation shows: one asyncpg connection, one entrypoint, run the way
`pgq run benchmarks.pgqueuer_app:main` runs it (its supervisor, on uvloop when installed), with every
option at its default (batch size 10, no concurrency cap, continuous mode). `pgq run` itself is not
used: in PgQueuer 1.6 with typer 0.29 its default `--log-level` fails before the worker starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
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
