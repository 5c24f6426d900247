"""awa-pg's side of `defaults.py`: runs only in a virtualenv of its own with `awa-pg` and `pydantic` installed
(awa-pg is no dependency of taskq; nothing here is imported by taskq or its tests).

    PGDSN=... python benchmarks/awa_app.py install          # its schema (awa's migrations), on a fresh database
    PGDSN=... python benchmarks/awa_app.py enqueue N        # a backlog of N no-op jobs
    PGDSN=... python benchmarks/awa_app.py worker [MAX]     # a worker: one queue, MAX handlers (default 200)

awa-pg (Rust runtime, Python handlers) as its README shows it: `AsyncClient`, one `@client.task` handler,
`client.start([("default", MAX)])`, its canonical storage (what `migrate()` sets up; its newer queue storage
is a staged transition and is not measured here). awa has no default handler count: `defaults.py` starts it
with 200 (taskq's default concurrency) in case `defaults` and 1,000 in case `wide`. SIGTERM or SIGINT: the
worker shuts down (`client.shutdown()`) and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import awa
from pydantic import BaseModel

ENQUEUE_BATCH = 5_000


class Noop(BaseModel):
    n: int


def database_url() -> str:
    """PGDSN, with a host in the URL's authority: awa's driver wants one even when the query names the socket
    directory (`?host=/path`, which then wins)."""
    url = os.environ["PGDSN"]
    return url.replace("@/", "@localhost/", 1) if "@/" in url else url


async def worker(max_workers: int) -> None:
    client = awa.AsyncClient(database_url(), max_connections=20)

    @client.task(Noop, queue="default")
    async def noop(job: object) -> None:
        return None

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await client.start([("default", max_workers)])
    await stop.wait()
    await client.shutdown()
    await client.close()


async def admin(command: str, count: int) -> None:
    client = awa.AsyncClient(database_url(), max_connections=2)
    try:
        if command == "install":
            await client.migrate()
            return
        for first in range(0, count, ENQUEUE_BATCH):
            await client.insert_many_copy([Noop(n=i) for i in range(first, min(first + ENQUEUE_BATCH, count))])
    finally:
        await client.close()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(worker(int(sys.argv[2]) if len(sys.argv) > 2 else 200))
    elif sys.argv[1] in ("install", "enqueue"):
        asyncio.run(admin(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0))
    else:
        sys.exit(f"unknown command {sys.argv[1]!r}: install, enqueue N or worker [MAX]")
