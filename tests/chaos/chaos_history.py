"""The run's history, Jepsen style: what the producer was told, kept where a lost commit cannot erase it.

With `--history-dsn` the history lives in a separate database (never the one under test, which may fail
over and lose its last commits): the actors' `chaos.effects` rows, one `chaos.ops` row per producer call
(an acknowledged enqueue or operator write: `ok`; a call whose outcome is unknown because the
connection broke mid-call: `info`, looked up again by its key before anything is counted: then `found`
or `absent`), and one `chaos.terminal_seen` row each time the producer first reads a job terminal.
Without it the same tables live in the database under test, as the effects always did.

Times are this host's wall clock (`datetime.now(UTC)`), on the actors' side too (`effects.began_at`):
the checks compare an execution's start with a terminal sighting, so both must come from one clock.
Every row carries the run's id, so that one history database can keep several runs.

The checks (issue 33, prior-art-ha.md section 6):

- I1: every acknowledged (or found) enqueue exists in the database under test at the end;
- I2: no execution began after its job was seen terminal (unless a requeue of it overlapped), and no job
  seen terminal ended otherwise (a reverted terminal write);
- I3: at most one execution per claim (job, attempt, claim_epoch, worker), and no stored result whose
  execution had another attempt, epoch or worker than the claim the row holds (a stale write let through).

With `expect_loss` (an asynchronous-replication leg) I1 and I2 are reported but do not fail the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import psycopg

TERMINAL = ("succeeded", "failed", "cancelled", "crashed", "abandoned")
ENQUEUE_OPS = frozenset({"enqueue", "enqueue_many", "workflow", "enqueue_unique"})
REOPENING_OPS = frozenset({"requeue"})
"""Operator writes after which a terminal job legitimately runs again."""

EFFECTS_DDL = """
CREATE SCHEMA IF NOT EXISTS chaos;
CREATE TABLE IF NOT EXISTS chaos.effects (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid        NOT NULL,
    attempt     integer     NOT NULL,
    claim_epoch bigint      NOT NULL,
    actor       text        NOT NULL,
    isolation   text        NOT NULL,
    pid         integer     NOT NULL,
    token       uuid        NOT NULL UNIQUE,
    started_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at timestamptz,
    outcome     text        CHECK (outcome IN ('returned', 'raised', 'cancelled', 'snoozed', 'suspended')),
    result      jsonb,
    children    uuid[],
    run         text        NOT NULL DEFAULT '',
    worker      text,
    began_at    timestamptz
);
CREATE INDEX IF NOT EXISTS effects_job_idx ON chaos.effects (job_id, claim_epoch);
CREATE TABLE IF NOT EXISTS chaos.step_effects (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run         text        NOT NULL DEFAULT '',
    job_id      uuid        NOT NULL,
    step        text        NOT NULL,
    attempt     integer     NOT NULL,
    claim_epoch bigint      NOT NULL,
    token       uuid        NOT NULL UNIQUE,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""
"""One row per actor execution (tests/apps/taskq_chaos_app.py writes them): `worker` is `host:pid` of
the worker that ran it, `began_at` the actor's own clock at its start. `chaos.step_effects`: one row per
run of a durable step's function (chaos.durable), the side effect that must happen once per job."""

HISTORY_DDL = """
CREATE TABLE IF NOT EXISTS chaos.ops (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run         text        NOT NULL,
    op          text        NOT NULL,
    job_id      uuid,
    key         text,
    unique_key  text,
    outcome     text        NOT NULL CHECK (outcome IN ('ok', 'info', 'found', 'absent')),
    sent_at     timestamptz NOT NULL,
    done_at     timestamptz NOT NULL,
    detail      text
);
CREATE INDEX IF NOT EXISTS ops_run_job_idx ON chaos.ops (run, job_id);
CREATE TABLE IF NOT EXISTS chaos.terminal_seen (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run         text        NOT NULL,
    job_id      uuid        NOT NULL,
    status      text        NOT NULL,
    attempt     integer     NOT NULL,
    claim_epoch bigint      NOT NULL,
    seen_at     timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS terminal_seen_run_job_idx ON chaos.terminal_seen (run, job_id);
"""

EFFECT_COLUMNS = ("job_id", "attempt", "claim_epoch", "actor", "isolation", "pid", "token", "started_at",
                  "finished_at", "outcome", "result", "children", "run", "worker", "began_at")
STEP_COLUMNS = "run, job_id, step, attempt, claim_epoch, token, at"


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Op:
    op: str
    job_id: UUID | None
    key: str | None
    outcome: str
    sent_at: datetime
    done_at: datetime
    unique_key: str | None = None
    detail: str = ""


@dataclass
class Seen:
    job_id: UUID
    status: str
    attempt: int
    claim_epoch: int
    seen_at: datetime


async def prepare_history(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        await conn.execute(EFFECTS_DDL)
        await conn.execute(HISTORY_DDL)


class History:
    """The producer's record: kept in memory for the checks and written, in the background and through
    any outage, to the history database (`chaos.ops`, `chaos.terminal_seen`)."""

    FLUSH_EVERY = 0.3
    POLL_EVERY = 0.5
    POLL_BATCH = 1000

    def __init__(self, history_dsn: str, db_dsn: str, run_id: str) -> None:
        self.history_dsn, self.db_dsn, self.run_id = history_dsn, db_dsn, run_id
        self.ops: list[Op] = []
        self.seen: list[Seen] = []
        self._unwritten_ops: list[Op] = []
        self._unwritten_seen: list[Seen] = []
        self._watch: dict[UUID, None] = {}
        """Acknowledged jobs not yet seen terminal, oldest first."""
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self.write_errors = 0
        self.poll_errors = 0

    # -- recording ---------------------------------------------------------------------------------

    def record(self, op: str, outcome: str, sent_at: datetime, *, job_id: UUID | None = None, key: str | None = None,
               unique_key: str | None = None, detail: str = "") -> None:
        entry = Op(op, job_id, key, outcome, sent_at, now(), unique_key, detail)
        self.ops.append(entry)
        self._unwritten_ops.append(entry)
        if job_id is not None and outcome in ("ok", "found") and (op in ENQUEUE_OPS or op in REOPENING_OPS):
            self._watch[job_id] = None

    def enqueued(self, op: str, items: Iterable[tuple[UUID, str | None, str | None]], sent_at: datetime,
                 outcome: str = "ok") -> None:
        """`items`: (job id, key, unique key) of each job the call returned (or a lookup found)."""
        for job_id, key, unique_key in items:
            self.record(op, outcome, sent_at, job_id=job_id, key=key, unique_key=unique_key)

    # -- background duties ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Write the history and watch for terminal jobs until `stop` is set."""
        await asyncio.gather(self._writer(stop), self._poller(stop))

    async def _writer(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.FLUSH_EVERY)
            await self.flush_once()

    async def flush_once(self) -> bool:
        ops, seen = self._unwritten_ops[:], self._unwritten_seen[:]
        if not ops and not seen:
            return True
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await psycopg.AsyncConnection.connect(self.history_dsn, autocommit=True,
                                                                   connect_timeout=5)
            async with self._conn.transaction(), self._conn.cursor() as cur:
                if ops:
                    await cur.executemany(
                        "INSERT INTO chaos.ops (run, op, job_id, key, unique_key, outcome, sent_at, done_at, detail) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        [(self.run_id, o.op, o.job_id, o.key, o.unique_key, o.outcome, o.sent_at, o.done_at,
                          o.detail[:500]) for o in ops])
                if seen:
                    await cur.executemany(
                        "INSERT INTO chaos.terminal_seen (run, job_id, status, attempt, claim_epoch, seen_at) "
                        "VALUES (%s, %s, %s, %s, %s, %s)",
                        [(self.run_id, s.job_id, s.status, s.attempt, s.claim_epoch, s.seen_at) for s in seen])
        except (psycopg.Error, OSError):
            self.write_errors += 1
            if self._conn is not None:
                with contextlib.suppress(Exception):
                    await self._conn.close()
                self._conn = None
            return False
        del self._unwritten_ops[: len(ops)]
        del self._unwritten_seen[: len(seen)]
        return True

    async def _poller(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.POLL_EVERY)
            await self.poll_once()

    async def poll_once(self) -> None:
        """Read the terminal ones among the watched jobs: each first sighting is a `terminal_seen` row
        (the time is taken after the read returned: the terminal write had committed by then)."""
        ids = list(self._watch)[: self.POLL_BATCH]
        if not ids:
            return
        try:
            async with await psycopg.AsyncConnection.connect(self.db_dsn, autocommit=True, connect_timeout=5) as conn:
                cur = await conn.execute("SELECT id, status, attempt, claim_epoch FROM taskq.jobs "
                                         "WHERE id = ANY(%s) AND status = ANY(%s)", (ids, list(TERMINAL)))
                rows = await cur.fetchall()
        except (psycopg.Error, OSError):
            self.poll_errors += 1
            return
        seen_at = now()
        for job_id, status, attempt, claim_epoch in rows:
            self._watch.pop(job_id, None)
            entry = Seen(job_id, status, attempt, claim_epoch, seen_at)
            self.seen.append(entry)
            self._unwritten_seen.append(entry)

    async def close(self, timeout: float = 60.0) -> bool:
        """Write what is left; False if the history database stayed unreachable for `timeout` seconds."""
        deadline = time.monotonic() + timeout
        try:
            while not await self.flush_once():
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.5)
            return True
        finally:
            if self._conn is not None:
                await self._conn.close()
                self._conn = None


async def copy_effects(history_dsn: str, db_dsn: str, run_id: str) -> int:
    """Copy the run's effects rows from the history database into the database under test's
    `chaos.effects`, so that the SQL checks can join them with taskq's rows. The history keeps them."""
    async with await psycopg.AsyncConnection.connect(history_dsn, autocommit=True) as src, \
            await psycopg.AsyncConnection.connect(db_dsn, autocommit=True) as dst:
        cols = ", ".join(EFFECT_COLUMNS)
        read = ", ".join(f"{c}::text" if c == "result" else c for c in EFFECT_COLUMNS)  # jsonb as its text
        rows = await (await src.execute(f"SELECT {read} FROM chaos.effects WHERE run = %s ORDER BY id",
                                        (run_id,))).fetchall()
        async with dst.cursor() as cur, cur.copy(f"COPY chaos.effects ({cols}) FROM STDIN") as copy:
            for row in rows:
                await copy.write_row(row)
        steps = await (await src.execute(f"SELECT {STEP_COLUMNS} FROM chaos.step_effects WHERE run = %s ORDER BY id",
                                         (run_id,))).fetchall()
        async with dst.cursor() as cur, cur.copy(f"COPY chaos.step_effects ({STEP_COLUMNS}) FROM STDIN") as copy:
            for row in steps:
                await copy.write_row(row)
    return len(rows)


# -- the checks -------------------------------------------------------------------------------------

HISTORY_CHECKS: dict[str, str] = {
    "I1_missing": "I1 every acknowledged enqueue exists at the end (missing)",
    "I2_rerun": "I2 no execution began after its job was seen terminal (re-runs)",
    "I2_reverted": "I2 every job seen terminal ended so (reverted terminal writes)",
    "I3_claim": "I3 at most one execution per claim (job, attempt, epoch, worker)",
    "I3_stale": "I3 no stored result from an execution of another claim or worker",
}
LOSS_CHECKS = frozenset({"I1_missing", "I2_rerun", "I2_reverted"})
"""What a lost commit (asynchronous replication) produces: reported, not failed, with `expect_loss`."""


@dataclass
class HistoryResult:
    violations: dict[str, list[str]] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)

    def count(self, name: str) -> int:
        return len(self.violations.get(name, []))

    def failing(self, expect_loss: bool) -> int:
        return sum(len(v) for k, v in self.violations.items() if not (expect_loss and k in LOSS_CHECKS))

    def render(self, expect_loss: bool) -> list[str]:
        lines = ["history checks (violations)" + (" [--expect-loss: I1/I2 reported, not failed]"
                                                  if expect_loss else "")]
        lines += [f"  {text:<75} {self.count(name)}" for name, text in HISTORY_CHECKS.items()]
        lines += [f"  {k:<75} {v}" for k, v in self.figures.items()]
        for name, found in self.violations.items():
            lines += [f"  ! {name} {d}" for d in found[:20]]
            if len(found) > 20:
                lines.append(f"  ... and {len(found) - 20} more")
        return lines


async def _rows(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


async def resolve_indeterminate(history: History) -> None:
    """Look up again, by key, every enqueue whose outcome stayed unknown: found -> counted as written."""
    resolved = {(o.op, o.key) for o in history.ops if o.outcome in ("ok", "found", "absent")}
    open_ = [o for o in history.ops if o.op in ENQUEUE_OPS and o.outcome == "info" and (o.op, o.key) not in resolved]
    keys = sorted({o.key for o in open_ if o.key and not o.unique_key})
    ukeys = sorted({o.unique_key for o in open_ if o.unique_key})
    found: dict[str, UUID] = {}
    if keys:
        found |= dict(await _rows(history.db_dsn, "SELECT payload->>'key', id FROM taskq.jobs "
                                                  "WHERE payload->>'key' = ANY(%s)", keys))
    if ukeys:
        found |= {f"u:{k}": i for k, i in await _rows(history.db_dsn, "SELECT unique_key, id FROM taskq.jobs "
                                                                      "WHERE unique_key = ANY(%s)", ukeys)}
    for o in open_:
        lookup = f"u:{o.unique_key}" if o.unique_key else o.key
        job_id = found.get(lookup or "")
        history.record(o.op, "found" if job_id else "absent", o.sent_at, job_id=job_id, key=o.key,
                       unique_key=o.unique_key, detail="looked up after the run")


async def check_history(history: History) -> HistoryResult:
    """I1-I3 against the database under test and the effects in the history database (see the module)."""
    result = HistoryResult()
    await resolve_indeterminate(history)
    run = history.run_id
    written = {o.job_id: o for o in history.ops if o.op in ENQUEUE_OPS and o.outcome in ("ok", "found") and o.job_id}
    watched = list(written) + [s.job_id for s in history.seen]
    final = {r[0]: r[1:] for r in await _rows(
        history.db_dsn, "SELECT id, status, attempt, claim_epoch FROM taskq.jobs WHERE id = ANY(%s)", watched)}

    # I1
    missing = [f"{job_id}: {o.op} of {o.key or o.unique_key} acknowledged at {o.done_at:%H:%M:%S.%f}, no row"
               for job_id, o in written.items() if job_id not in final]
    if missing:
        result.violations["I1_missing"] = missing

    # I2
    effects = await _rows(history.history_dsn,
                          "SELECT job_id, attempt, claim_epoch, worker, began_at, token FROM chaos.effects "
                          "WHERE run = %s AND began_at IS NOT NULL", run)
    by_job: dict[UUID, list[tuple[Any, ...]]] = {}
    for row in effects:
        by_job.setdefault(row[0], []).append(row)
    reopened: dict[UUID, list[tuple[datetime, datetime]]] = {}
    for o in history.ops:
        if o.op in REOPENING_OPS and o.job_id is not None and o.outcome in ("ok", "info"):
            reopened.setdefault(o.job_id, []).append((o.sent_at, o.done_at))

    def reopened_between(job_id: UUID, after: datetime, before: datetime | None) -> bool:
        return any(sent < (before or datetime.max.replace(tzinfo=UTC)) and done >= after
                   for sent, done in reopened.get(job_id, []))

    reruns, reverted = [], []
    latest: dict[UUID, Seen] = {}
    for s in history.seen:
        if s.job_id not in latest or s.seen_at > latest[s.job_id].seen_at:
            latest[s.job_id] = s
        for _, attempt, epoch, worker, began_at, token in by_job.get(s.job_id, []):
            # a zombie of an earlier claim that only now reached its first line has a lower epoch;
            # a claim the failover lost and reissued has the same one
            if began_at > s.seen_at and epoch >= s.claim_epoch and not reopened_between(s.job_id, s.seen_at, began_at):
                reruns.append(f"{s.job_id}: seen {s.status} (attempt {s.attempt} claim {s.claim_epoch}) at "
                              f"{s.seen_at:%H:%M:%S.%f}; attempt {attempt} claim {epoch} began on {worker} at "
                              f"{began_at:%H:%M:%S.%f} (token {token})")
    for job_id, s in latest.items():
        if reopened_between(job_id, s.seen_at, None):
            continue
        now_ = final.get(job_id)
        if now_ is None or (now_[0], now_[2]) != (s.status, s.claim_epoch):
            reverted.append(f"{job_id}: seen {s.status} at claim {s.claim_epoch}, ends "
                            + ("without a row" if now_ is None else f"{now_[0]} at claim {now_[2]}"))
    if reruns:
        result.violations["I2_rerun"] = reruns
    if reverted:
        result.violations["I2_reverted"] = reverted

    # I3
    claims = await _rows(history.history_dsn,
                         "SELECT job_id, attempt, claim_epoch, worker, count(*) FROM chaos.effects "
                         "WHERE run = %s GROUP BY 1, 2, 3, 4 HAVING count(*) > 1", run)
    if claims:
        result.violations["I3_claim"] = [f"{j}: {n} executions of attempt {a} claim {e} on {w}"
                                         for j, a, e, w, n in claims]
    stored = await _rows(history.db_dsn,
                         "SELECT j.id, j.attempt, j.claim_epoch, j.result->>'token', a.worker_id FROM taskq.jobs j "
                         "LEFT JOIN taskq.job_attempts a ON a.job_id = j.id AND a.claim_epoch = j.claim_epoch "
                         "WHERE j.status = 'succeeded' AND left(j.actor, 6) = 'chaos.' AND j.result ? 'token'")
    by_token = {str(row[5]): row for row in effects}
    stale = []
    for job_id, attempt, epoch, token, holder in stored:
        e = by_token.get(token)
        if e is None:
            stale.append(f"{job_id}: result token {token} names no execution of this run")
            continue
        same_worker = holder is None or e[3] is None or ":".join(holder.split(":")[:2]) == e[3] \
            or holder.count(":") < 2  # a worker id set by hand does not name its host and pid
        if (e[0], e[1], e[2]) != (job_id, attempt, epoch) or not same_worker:
            stale.append(f"{job_id}: row holds attempt {attempt} claim {epoch} of {holder}; its result came "
                         f"from job {e[0]} attempt {e[1]} claim {e[2]} on {e[3]}")
    if stale:
        result.violations["I3_stale"] = stale

    result.figures |= figures(history, final)
    return result


def figures(history: History, final: dict[UUID, tuple[Any, ...]]) -> dict[str, Any]:
    by = {outcome: sum(o.outcome == outcome for o in history.ops if o.op in ENQUEUE_OPS)
          for outcome in ("ok", "info", "found", "absent")}
    operator: dict[str, int] = {}
    for o in history.ops:
        if o.op not in ENQUEUE_OPS:
            operator[f"{o.op} {o.outcome}"] = operator.get(f"{o.op} {o.outcome}", 0) + 1
    acked = sorted(o.done_at for o in history.ops if o.op in ENQUEUE_OPS and o.outcome == "ok")
    gap, gap_at = 0.0, ""
    for a, b in itertools.pairwise(acked):
        if (b - a).total_seconds() > gap:
            gap, gap_at = (b - a).total_seconds(), f"{a:%H:%M:%S.%f} -> {b:%H:%M:%S.%f}"
    return {
        "acknowledged enqueues (jobs)": by["ok"],
        "longest gap between acknowledged enqueues (s)": round(gap, 2),
        "  between": gap_at or "-",
        "indeterminate enqueue calls (info) / found / absent": f"{by['info']} / {by['found']} / {by['absent']}",
        "operator writes (by op and outcome)": ", ".join(f"{k}: {v}" for k, v in sorted(operator.items())) or "none",
        "jobs seen terminal during the run": len({s.job_id for s in history.seen}),
        "history writes retried / terminal polls failed": f"{history.write_errors} / {history.poll_errors}",
    }


async def corrupt_history(dsn: str, history: History, how: str) -> str:
    """Make the database under test contradict the history, as a lost commit would: 'delete' the row of an
    acknowledged job (I1, and I2 if it was seen terminal), 'revert' a terminal write the producer saw (I2)."""
    seen = {s.job_id: s for s in history.seen}
    acked = [o.job_id for o in history.ops if o.op in ENQUEUE_OPS and o.outcome == "ok" and o.job_id in seen]
    if not acked:
        return "nothing to corrupt (no acknowledged job was seen terminal)"
    job_id = acked[0]
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        if how == "delete":
            await conn.execute("DELETE FROM taskq.jobs WHERE id = %s", (job_id,))
            return f"job {job_id} deleted after the producer saw it {seen[job_id].status}"
        await conn.execute("UPDATE taskq.jobs SET status = 'pending', result = NULL, finished_at = NULL, "
                           "worker_id = NULL, lock_expires_at = NULL, revision = revision + 1 WHERE id = %s",
                           (job_id,))
    return f"job {job_id} put back to pending after the producer saw it {seen[job_id].status}"
