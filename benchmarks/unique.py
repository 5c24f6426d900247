"""Unique enqueue: the cost of a unique key, single and in batches of 100, against the same without one.

    python benchmarks/unique.py [--dsn DSN] [--seconds 3] [--rounds 3] [--slices 6]
                                [--json benchmarks/results/unique.json]

Every measurement writes the same jobs (bench.resize, the payload of benchmarks/enqueue.py) through one
pooled connection, so the serving backend's CPU is the server's share. With a key, every key is new (the
insert path, which is what a producer pays); the duplicate path (the key held, nothing written: one
INSERT that does nothing plus one lookup) is measured beside them for reference. Each round cuts every
measurement into --slices turns taken in rotation, from an emptied table each time, and the median of
the rounds is reported: only figures of one run are compared. Target: with a key at most 15 % slower.
(f)/(g) compare the same raw INSERT without a key on a schema-2 and a schema-3 database (the new columns
and the partial unique index), interleaved in the same rounds: the server's cost of the no-key path.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import uvloop
from _common import DSN_HELP, announce, bench_database, header, machine, print_table, server_facts, write_report
from enqueue import RAW_INSERT, Image, Sample, _payload, _timed, backend_pid, registry, resize
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

from taskq import sql
from taskq.backend import uuid7
from taskq.client import JobsClient
from taskq.dsn import resolve_dsn

TARGET_SLOWDOWN = 0.15
"""With a key, jobs/s at most this much below the same without one."""


@dataclass
class Measurement:
    name: str
    label: str
    run: Callable[[float], Awaitable[Sample]]
    rounds: list[Sample] = field(default_factory=list)


@contextlib.contextmanager
def schema_2_database(dsn: str | None) -> Iterator[str]:
    """A database with only migrations 1 and 2: the jobs table as it was before unique keys."""
    admin = resolve_dsn(dsn)
    name = f"taskq_bench_unique_v2_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    v2 = make_conninfo(admin, dbname=name)
    try:
        with psycopg.connect(v2, autocommit=True) as conn:
            conn.execute(sql.query("migrations_bootstrap"))
            for migration in sql.migrations()[:2]:
                conn.execute(migration.sql)
        yield v2
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name)))


def raw_insert(conn: psycopg.AsyncConnection[Any], pid: int) -> Callable[[float], Awaitable[Sample]]:
    """A prepared INSERT without a key (benchmarks/enqueue.py's raw row): the server's side alone."""
    counter = itertools.count()

    async def go(seconds: float) -> Sample:
        async def step() -> int:
            payload = Image.model_validate(_payload(next(counter))).model_dump_json()
            await conn.execute(RAW_INSERT, (uuid7(), "bench.resize", "default", payload, 0, [], 3), prepare=True)
            return 1

        return await _timed(seconds, step, pid)

    return go


def measurements(client: JobsClient, pid: int) -> list[Measurement]:
    counter = itertools.count()

    def single(key: Callable[[int], str | None]) -> Callable[[float], Awaitable[Sample]]:
        async def go(seconds: float) -> Sample:
            async def step() -> int:
                i = next(counter)
                await client.enqueue(resize, _payload(i), unique_key=key(i))
                return 1

            return await _timed(seconds, step, pid)

        return go

    def batch(keys: Callable[[int], list[str | None] | None]) -> Callable[[float], Awaitable[Sample]]:
        async def go(seconds: float) -> Sample:
            async def step() -> int:
                start = next(counter) * 100
                await client.enqueue_many(resize, [_payload(start + i) for i in range(100)], unique_key=keys(start))
                return 100

            return await _timed(seconds, step, pid)

        return go

    async def duplicate(seconds: float) -> Sample:
        await client.enqueue(resize, _payload(0), unique_key="held")  # the holder, once per turn (untimed)

        async def step() -> int:
            handle = await client.enqueue(resize, _payload(next(counter)), unique_key="held")
            assert not handle.created
            return 1

        return await _timed(seconds, step, pid)

    return [
        Measurement("single_no_key", "(a) enqueue, no key", single(lambda i: None)),
        Measurement("single_unique_key", "(b) enqueue, unique_key (new)", single(lambda i: f"order-{i}")),
        Measurement("batch100_no_key", "(c) enqueue_many 100, no key", batch(lambda s: None)),
        Measurement("batch100_unique_key", "(d) enqueue_many 100, unique keys (new)",
                    batch(lambda s: [f"order-{s + i}" for i in range(100)])),
        Measurement("single_duplicate", "(e) enqueue, key held (duplicate)", duplicate),
    ]


async def _truncate(*dsns: str) -> None:
    for dsn in dsns:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE taskq.jobs, taskq.job_events")
            await conn.execute("VACUUM ANALYZE taskq.jobs")


async def run(dsn: str, v2_dsn: str, seconds: float, rounds: int, slices: int) -> list[Measurement]:
    client = await JobsClient.connect(dsn, registry=registry, min_size=1, max_size=1)
    raw_v3 = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    raw_v2 = await psycopg.AsyncConnection.connect(v2_dsn, autocommit=True)
    try:
        async with client.backend.pool.connection() as conn:
            pid = await backend_pid(conn)
        ms = [
            *measurements(client, pid),
            Measurement("raw_insert_schema_2", "(f) raw INSERT, no key, schema 2",
                        raw_insert(raw_v2, await backend_pid(raw_v2))),
            Measurement("raw_insert_schema_3", "(g) raw INSERT, no key, schema 3",
                        raw_insert(raw_v3, await backend_pid(raw_v3))),
        ]
        for m in ms:  # warm up: prepared statements, pool, caches
            await _truncate(dsn, v2_dsn)
            await m.run(min(0.5, seconds))
        for r in range(rounds):
            totals = {m.name: Sample() for m in ms}
            for _ in range(slices):
                for m in ms:
                    await _truncate(dsn, v2_dsn)
                    totals[m.name].add(await m.run(seconds / slices))
            for m in ms:
                m.rounds.append(totals[m.name])
                s = totals[m.name]
                print(f"  round {r + 1}/{rounds} {m.name:<20} {s.jobs_per_s:>10,.0f} jobs/s", file=sys.stderr)
    finally:
        await raw_v2.close()
        await raw_v3.close()
        await client.close()
    return ms


def _median(samples: list[Sample], attr: str) -> float:
    values = [getattr(s, attr) for s in samples]
    return float("nan") if None in values else float(statistics.median(values))


def summarize(ms: list[Measurement]) -> dict[str, Any]:
    results: dict[str, Any] = {
        m.name: {
            "label": m.label,
            "rounds": [s.jobs_per_s for s in m.rounds],
            "median": _median(m.rounds, "jobs_per_s"),
            "client_cpu_us_per_job": _median(m.rounds, "client_cpu_us"),
            "server_cpu_us_per_job": _median(m.rounds, "server_cpu_us"),
        }
        for m in ms
    }
    targets = {}
    pairs = (("single_unique_key", "single_no_key"), ("batch100_unique_key", "batch100_no_key"),
             ("raw_insert_schema_3", "raw_insert_schema_2"))
    for keyed, plain in pairs:
        slowdown = 1 - results[keyed]["median"] / results[plain]["median"]
        targets[keyed] = {
            "slowdown": slowdown, "target": f"<= {TARGET_SLOWDOWN:.0%}", "met": slowdown <= TARGET_SLOWDOWN,
        }
    results["targets"] = targets
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None, help=DSN_HELP)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per measurement per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    parser.add_argument("--slices", type=int, default=6, help="turns each round's time is cut into")
    parser.add_argument("--synchronous-commit", choices=("on", "off"), default="on",
                        help="off takes the commit flush (and its noise on a shared disk) out of every figure")
    parser.add_argument("--json", type=Path, default=None, help="where to write results (benchmarks/results/)")
    args = parser.parse_args()
    params = {"seconds": args.seconds, "rounds": args.rounds, "slices": args.slices, "loop": "uvloop",
              "synchronous_commit": args.synchronous_commit}
    info = machine()
    with bench_database(args.dsn, "unique") as dsn, schema_2_database(args.dsn) as v2_dsn:
        if args.synchronous_commit == "off":
            dsn, v2_dsn = (make_conninfo(d, options="-c synchronous_commit=off") for d in (dsn, v2_dsn))
        server = server_facts(dsn)
        announce("unique", params, info, server)
        ms = uvloop.run(run(dsn, v2_dsn, args.seconds, args.rounds, args.slices))
    results = summarize(ms)
    print_table(
        ("measurement", "jobs/s", "client us/job", "server us/job", "CPU us/job", "rounds (jobs/s)"),
        [
            (r["label"], r["median"], r["client_cpu_us_per_job"], r["server_cpu_us_per_job"],
             r["client_cpu_us_per_job"] + r["server_cpu_us_per_job"], ", ".join(f"{x:,.0f}" for x in r["rounds"]))
            for name, r in results.items() if name != "targets"
        ],
    )
    for name, t in results["targets"].items():
        verdict = "met" if t["met"] else "MISSED"
        print(f"{results[name]['label']}: {t['slowdown']:+.1%} slower than its reference "
              f"(target {t['target']}): {verdict}")
    suffix = "" if args.synchronous_commit == "on" else "_sync_off"
    path = write_report(f"unique{suffix}", header("unique", params, info, server) | {"results": results}, args.json)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
