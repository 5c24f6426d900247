"""The checks of the chaos run, its report, and the record of what the driver planned and did.

Everything here reads the database after the run: `taskq.invariants.check_invariants` plus the chaos
checks, which compare taskq's rows with `chaos.effects` (what the actors did, written by themselves; see
tests/apps/taskq_chaos_app.py) and with the plan (every job accounted for, no phantom cancel).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import psycopg
from chaos_capabilities import FAIR_QUEUE, KEY_PREFIX, LIMITED_QUEUE, RATE_LIMIT, RATE_PERIOD
from chaos_history import EFFECTS_DDL, HISTORY_CHECKS, HistoryResult
from psycopg.types.json import Jsonb

from taskq.backend.migrations import migrate_dsn
from taskq.invariants import InvariantReport, check_invariants

FUTURE_TAG = "chaos-future"
TERMINAL = ("succeeded", "failed", "cancelled", "crashed", "abandoned")



@dataclass
class Planned:
    """One top-level job of the workload: what the driver planned, then what it did with it."""

    key: str
    actor: str
    work: dict[str, Any]
    at: float
    """Seconds after the start at which it is enqueued."""
    max_attempts: int = 5
    future: bool = False
    cancel_after: float | None = None
    job_id: UUID | None = None
    via: str = ""
    """How it was enqueued: 'enqueue', 'enqueue_many', or found after an ambiguous failure."""
    cancel_outcome: str | None = None
    """previous status seen by the cancel ('running', 'pending'...), or 'error'."""
    error: str | None = None
    graph: str | None = None
    """The graph (workflow) this job belongs to: its jobs are enqueued together in one transaction."""
    depends_on: tuple[str, ...] = ()
    """Keys of the earlier jobs of its graph it waits for."""
    dependency_mode: str = "on_success"


async def prepare_schema(dsn: str) -> None:
    await migrate_dsn(dsn)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(EFFECTS_DDL)
        cur = await conn.execute("SELECT count(*) FROM taskq.jobs")
        row = await cur.fetchone()
        if row is not None and row[0]:
            raise SystemExit(f"the chaos database must be empty; it holds {row[0]} jobs")


async def fetch(dsn: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True, connect_timeout=5) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall() if cur.description else []


# -- the checks -------------------------------------------------------------------------------------

CHAOS_CHECKS: dict[str, tuple[str, str]] = {
    "drained": (
        "every job terminal, or scheduled ahead on purpose and never run",
        f"""SELECT id, format('%s at attempt %s', status, attempt) FROM taskq.jobs
            WHERE status NOT IN {TERMINAL!r}
              AND NOT ('{FUTURE_TAG}' = ANY(tags) AND status = 'scheduled' AND attempt = 0)""",
    ),
    "result_is_final_execution": (
        "a succeeded job's result is what its final claim's execution returned",
        """SELECT j.id, format('result token %s; effect of claim %s: %s %s', j.result->>'token', j.claim_epoch,
                              coalesce(e.outcome, 'none'), coalesce(e.token::text, ''))
           FROM taskq.jobs j LEFT JOIN chaos.effects e ON e.job_id = j.id AND e.claim_epoch = j.claim_epoch
           WHERE j.status = 'succeeded'
             AND (e.id IS NULL OR e.outcome IS DISTINCT FROM 'returned' OR e.result IS DISTINCT FROM j.result
                  OR e.attempt <> j.attempt)""",
    ),
    "no_fenced_out_result": (
        "no stored result comes from a fenced-out execution",
        """SELECT j.id, format('result of job %s claim %s (token %s) stored on claim %s', e.job_id, e.claim_epoch,
                              e.token, j.claim_epoch)
           FROM taskq.jobs j JOIN chaos.effects e ON e.token::text = j.result->>'token'
           WHERE e.job_id <> j.id OR e.claim_epoch <> j.claim_epoch
           UNION ALL
           SELECT id, format('%s row with a result', status) FROM taskq.jobs
           WHERE status <> 'succeeded' AND result IS NOT NULL""",
    ),
    "execution_under_claim": (
        "every execution ran under a claim (an attempts row with its attempt and epoch)",
        """SELECT e.job_id, format('execution of attempt %s claim %s without a claim', e.attempt, e.claim_epoch)
           FROM chaos.effects e LEFT JOIN taskq.job_attempts a
                ON a.job_id = e.job_id AND a.claim_epoch = e.claim_epoch AND a.attempt = e.attempt
           WHERE a.job_id IS NULL""",
    ),
    "one_execution_per_claim": (
        "at most one execution per claim",
        """SELECT job_id, format('%s executions of claim %s', count(*), claim_epoch) FROM chaos.effects
           GROUP BY job_id, claim_epoch HAVING count(*) > 1""",
    ),
    "no_claim_after_cancel": (
        "no claim after an operator's cancel was recorded",
        """SELECT c.job_id, format('claimed by event %s after the cancel of event %s', r.id, c.id)
           FROM taskq.job_events c JOIN taskq.job_events r ON r.job_id = c.job_id AND r.id > c.id
           WHERE (c.kind = 'cancel_requested' OR (c.kind = 'state_change' AND c.to_status = 'cancelled'))
             AND r.kind = 'state_change' AND r.to_status = 'running' AND r.from_status <> 'running'""",
    ),
    "failures_as_asked": (
        "a job succeeds only on an attempt its work lets succeed (or with a partial result)",
        """SELECT id, format('succeeded at attempt %s; work says %s', attempt, payload) FROM taskq.jobs
           WHERE status = 'succeeded' AND NOT coalesce((result->>'partial')::boolean, false)
             AND (coalesce((payload->>'always_fail')::boolean, false)
                  OR attempt <= coalesce((payload->>'fail_attempts')::int, 0))""",
    ),
    "children_from_executions": (
        "every child job was enqueued by an execution of its parent",
        """SELECT c.id, format('child %s of parent %s', c.payload->>'key', c.parent_id)
           FROM taskq.jobs c LEFT JOIN taskq.jobs p ON p.id = c.parent_id
           WHERE c.parent_id IS NOT NULL
             AND (p.id IS NULL OR NOT EXISTS (
                  SELECT 1 FROM chaos.effects e WHERE e.job_id = p.id
                    AND c.payload->>'key' LIKE (p.payload->>'key') || '/e' || e.claim_epoch || '/c%'))
           UNION ALL
           SELECT e.job_id, format('effect lists child %s, which does not exist', ch)
           FROM chaos.effects e CROSS JOIN LATERAL unnest(e.children) AS ch
           WHERE NOT EXISTS (SELECT 1 FROM taskq.jobs c WHERE c.id = ch AND c.parent_id = e.job_id)""",
    ),
    # -- the capabilities (chaos_capabilities.py) --
    "schedule_one_per_slot": (
        "at most one job per schedule slot",
        """SELECT min(id::text), format('%s jobs for slot %s of schedule %s', count(*), scheduled_for, schedule)
           FROM taskq.jobs WHERE schedule IS NOT NULL GROUP BY schedule, scheduled_for HAVING count(*) > 1""",
    ),
    "limits_sampled": ("no sample over a concurrency, rate or unique-key limit (every 0.2 s)", ""),
    "rate_never_exceeded": (
        f"never more than {RATE_LIMIT} starts of {LIMITED_QUEUE} in any {RATE_PERIOD:g} s (all attempts)",
        f"""WITH lim AS (SELECT a.job_id, a.started_at FROM taskq.job_attempts a JOIN taskq.jobs j ON j.id = a.job_id
                         WHERE j.queue = '{LIMITED_QUEUE}')
            SELECT job_id, format('%s starts in the {RATE_PERIOD:g} s up to %s', n, started_at)
            FROM (SELECT a.job_id, a.started_at,
                         (SELECT count(*) FROM lim b WHERE b.started_at <= a.started_at
                            AND b.started_at > a.started_at - interval '{RATE_PERIOD} seconds') AS n
                  FROM lim a) AS w
            WHERE n > {RATE_LIMIT}""",
    ),
    "pause_holds": ("no job of a paused queue started after the pause was acknowledged", ""),
    "claims_monotonic": (
        "attempt and claim_epoch never go back over a job's claims (snoozes, requeues, sleeps)",
        """SELECT job_id, format('claim %s: attempt %s after attempt %s, started %s after %s', claim_epoch,
                                 attempt, prev_attempt, started_at, prev_started)
           FROM (SELECT job_id, claim_epoch, attempt, started_at,
                        lag(attempt) OVER w AS prev_attempt, lag(started_at) OVER w AS prev_started
                 FROM taskq.job_attempts WINDOW w AS (PARTITION BY job_id ORDER BY claim_epoch)) AS x
           WHERE attempt < prev_attempt OR started_at < prev_started
           UNION ALL
           SELECT job_id, format('claim event %s has claim %s after claim %s', id, epoch, prev_epoch)
           FROM (SELECT job_id, id, (detail->>'claim_epoch')::bigint AS epoch,
                        lag((detail->>'claim_epoch')::bigint) OVER (PARTITION BY job_id ORDER BY id) AS prev_epoch
                 FROM taskq.job_events WHERE kind = 'state_change' AND to_status = 'running'
                   AND detail ? 'claim_epoch') AS y
           WHERE epoch <= prev_epoch""",
    ),
    "fair_all_terminal": (
        "every job of the fair queue (keys a and b) terminal",
        f"""SELECT id, format('key %s: %s', fairness_key, status) FROM taskq.jobs
            WHERE queue = '{FAIR_QUEUE}' AND status NOT IN {TERMINAL!r}""",
    ),
    "step_once": (
        "a durable step's side effect runs at most once per job (never after a claim stored it)",
        """SELECT se.job_id, format('step %s ran on claim %s after claim %s stored it', se.step, se.claim_epoch,
                                    s.claim_epoch)
           FROM chaos.step_effects se JOIN taskq.job_steps s
                ON s.job_id = se.job_id AND s.kind = 'step' AND s.name = se.step
           WHERE se.claim_epoch > s.claim_epoch
           UNION ALL
           SELECT s.job_id, format('stored step %s holds %s, which no run of it returned', s.name, s.result)
           FROM taskq.job_steps s JOIN taskq.jobs j ON j.id = s.job_id AND j.actor = 'chaos.durable'
           WHERE s.kind = 'step' AND NOT EXISTS (SELECT 1 FROM chaos.step_effects se WHERE se.job_id = s.job_id
                                                   AND se.step = s.name AND se.token::text = s.result #>> '{}')""",
    ),
    "durable_completed": (
        "every durable job slept, took its signal and succeeded (unless cancelled)",
        """SELECT id, format('%s (%s) with %s sleeps and %s signals stored', status, coalesce(error_class, '-'),
                             (SELECT count(*) FROM taskq.job_steps s WHERE s.job_id = j.id AND s.kind = 'sleep'),
                             (SELECT count(*) FROM taskq.job_steps s WHERE s.job_id = j.id AND s.kind = 'signal'))
           FROM taskq.jobs j WHERE actor = 'chaos.durable' AND status <> 'cancelled'
             AND (status <> 'succeeded'
                  OR NOT EXISTS (SELECT 1 FROM taskq.job_steps s WHERE s.job_id = j.id AND s.kind = 'sleep')
                  OR (coalesce((payload->>'signal')::boolean, false)
                      AND NOT EXISTS (SELECT 1 FROM taskq.job_steps s WHERE s.job_id = j.id AND s.kind = 'signal')))""",
    ),
    "accounted": ("every planned job exists exactly once, and nothing else was enqueued", ""),
    "cancelled_by_operator": ("every cancelled or abandoned job is one the operator cancelled", ""),
    "supervisor_stopped": ("the drained fleet stopped on SIGTERM with exit code 0", ""),
}


EVIDENCE = (
    "SELECT 'job', status, attempt, claim_epoch, interrupt_count, cancel_requested_at, error_class, payload "
    "FROM taskq.jobs WHERE id = %s",
    "SELECT 'event', id, at, kind, from_status, to_status, attempt, worker_id, detail FROM taskq.job_events "
    "WHERE job_id = %s ORDER BY id",
    "SELECT 'attempt', attempt, claim_epoch, worker_id, started_at, finished_at, outcome, error_class "
    "FROM taskq.job_attempts WHERE job_id = %s ORDER BY claim_epoch",
    "SELECT 'execution', attempt, claim_epoch, isolation, pid, started_at, finished_at, outcome, token "
    "FROM chaos.effects WHERE job_id = %s ORDER BY id",
)
EXECUTION_LABELS = (
    "executions (effects rows)",
    "  returned a result that was not stored",
    "  overlapped a later claim of the same job",
    "  never ended (their process was killed)",
)
EXECUTION_SUMMARY = """
SELECT (SELECT count(*) FROM chaos.effects),
       (SELECT count(*) FROM chaos.effects e JOIN taskq.jobs j ON j.id = e.job_id
        WHERE e.outcome = 'returned' AND e.token::text IS DISTINCT FROM j.result->>'token'),
       (SELECT count(DISTINCT a.id) FROM chaos.effects a JOIN chaos.effects b
             ON b.job_id = a.job_id AND b.claim_epoch > a.claim_epoch AND b.started_at < a.finished_at),
       (SELECT count(*) FROM chaos.effects WHERE outcome IS NULL)
"""


LOSS_SENSITIVE = frozenset({"accounted", "execution_under_claim", "one_execution_per_claim",
                            "children_from_executions", "result_is_final_execution", "pause_holds", "step_once",
                            "durable_completed"})
"""Chaos checks that a commit lost by a failover breaks by itself (a lost enqueue, a lost claim reissued with
the same epoch, a lost child): with `expect_loss` they are reported and do not fail the run. The history's I3
(one execution per claim and worker, no stale result) still does."""


@dataclass
class ChaosReport:
    invariants: InvariantReport
    run: dict[str, Any]
    violations: dict[str, list[str]] = field(default_factory=dict)
    executions: dict[int, int] = field(default_factory=dict)
    """Executions (effects rows) per job -> number of jobs."""
    evidence: list[str] = field(default_factory=list)
    history: HistoryResult | None = None
    expect_loss: bool = False
    """Losses are expected (an asynchronous-replication leg): I1, I2 and LOSS_SENSITIVE do not fail the run."""
    duration: float = 0.0

    @property
    def total(self) -> int:
        return (len(self.invariants.violations) + sum(len(v) for v in self.violations.values())
                + (sum(len(v) for v in self.history.violations.values()) if self.history else 0))

    @property
    def failing(self) -> int:
        """The violations that fail the run (all of them, unless losses are expected)."""
        tolerated = LOSS_SENSITIVE if self.expect_loss else frozenset()
        return (len(self.invariants.violations)
                + sum(len(v) for k, v in self.violations.items() if k not in tolerated)
                + (self.history.failing(self.expect_loss) if self.history else 0))

    @property
    def ok(self) -> bool:
        return self.failing == 0

    def render(self) -> str:
        lines = ["=" * 100, "taskq chaos run", "=" * 100, self.invariants.render(self.run)]
        lines.append("executions per job (effects rows)")
        lines += [f"  {k:<40} {v}" for k, v in sorted(self.executions.items())]
        lines.append("chaos checks (violations)")
        for name, (text, _) in CHAOS_CHECKS.items():
            lines.append(f"  {text:<75} {len(self.violations.get(name, []))}")
        for name, found in self.violations.items():
            for detail in found[:20]:
                lines.append(f"  ! {name} {detail}")
            if len(found) > 20:
                lines.append(f"  ... and {len(found) - 20} more")
        if self.history is not None:
            lines += self.history.render(self.expect_loss)
        if self.evidence:
            lines.append("evidence (events, attempts, executions of the first violating jobs)")
            lines += ["  " + line for line in self.evidence]
        verdict = "PASS" if self.ok else "FAIL"
        lines.append(f"chaos violations: {sum(len(v) for v in self.violations.values())}")
        tolerated = f", {self.total - self.failing} tolerated (--expect-loss)" if self.total != self.failing else ""
        lines.append(f"RESULT: {verdict} ({self.total} violations in all{tolerated})")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """What `--json-report` writes: every check's count, the figures, the duration."""
        history = self.history or HistoryResult()
        return {
            "ok": self.ok,
            "expect_loss": self.expect_loss,
            "duration_s": round(self.duration, 1),
            "violations": self.total,
            "failing": self.failing,
            "invariants": self.invariants.by_invariant(),
            "chaos_checks": {name: len(self.violations.get(name, [])) for name in CHAOS_CHECKS},
            "history_checks": {name: history.count(name) for name in HISTORY_CHECKS},
            "history": history.figures,
            "jobs_by_status": self.invariants.jobs_by_status,
            "executions_per_job": {str(k): v for k, v in sorted(self.executions.items())},
            "run": {k.strip(): v if isinstance(v, int | float | str | bool) or v is None else str(v)
                    for k, v in self.run.items()},
            "details": {name: found[:50] for name, found in
                        [*self.violations.items(), *history.violations.items()]},
        }


async def run_checks(dsn: str, plan: list[Planned], run: dict[str, Any], supervisor_code: int | None,
                     stale_after: float) -> ChaosReport:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        invariants = await check_invariants(conn, stale_after=stale_after)
        report = ChaosReport(invariants, run)
        for name, (_, query) in CHAOS_CHECKS.items():
            if query:
                cur = await conn.execute(query)
                found = [f"{job_id}: {detail}" for job_id, detail in await cur.fetchall()]
                if found:
                    report.violations[name] = found
        cur = await conn.execute("SELECT n, count(*) FROM (SELECT j.id, count(e.id) AS n FROM taskq.jobs j "
                                 "LEFT JOIN chaos.effects e ON e.job_id = j.id GROUP BY j.id) x GROUP BY n")
        report.executions = {int(n): int(c) for n, c in await cur.fetchall()}
        cur = await conn.execute(EXECUTION_SUMMARY)
        row = await cur.fetchone()
        assert row is not None
        for label, value in zip(EXECUTION_LABELS, row, strict=True):
            report.run[label] = value
        cur = await conn.execute("SELECT id, payload->>'key', status, parent_id IS NULL, error_class FROM taskq.jobs")
        jobs = await cur.fetchall()
    report.violations |= _accounting(plan, jobs)
    if supervisor_code != 0:  # 1: a worker of an idle fleet did not stop cleanly (see its log)
        report.violations["supervisor_stopped"] = [f"exit code {supervisor_code}"]
    report.evidence = await _evidence(dsn, report)
    return report


async def _evidence(dsn: str, report: ChaosReport, limit: int = 5) -> list[str]:
    """The timeline, attempts and executions of the first violating jobs, for the post-mortem."""
    ids: list[str] = [str(v.job_id) for v in report.invariants.violations]
    ids += [d.split(":", 1)[0] for found in report.violations.values() for d in found]
    lines: list[str] = []
    for job_id in [i for i in dict.fromkeys(ids) if _is_uuid(i)][:limit]:
        lines.append(f"job {job_id}")
        for query in EVIDENCE:
            with contextlib.suppress(Exception):
                lines += ["    " + " | ".join(map(str, row)) for row in await fetch(dsn, query, job_id)]
    return lines


def _accounting(plan: list[Planned], jobs: list[tuple[Any, ...]]) -> dict[str, list[str]]:
    """`jobs`: (id, key, status, top-level) of every row. Top-level rows must be the plan, one row per
    planned job; cancelled and abandoned rows (children included) must be jobs the operator cancelled."""
    found: dict[str, list[str]] = {}
    by_key: dict[str, list[UUID]] = {}
    for job_id, key, _, top_level, _ in jobs:
        if top_level and not (key or "").startswith(KEY_PREFIX):  # the capability jobs: the history's I1
            by_key.setdefault(key, []).append(job_id)
    planned = {p.key: p for p in plan}
    accounted = []
    for p in plan:
        ids = by_key.get(p.key, [])
        if p.job_id is None:
            accounted.append(f"{p.key}: never enqueued ({p.error})")
        elif ids != [p.job_id]:
            accounted.append(f"{p.key}: enqueued as {p.job_id}, rows {ids}")
    accounted += [f"{key}: {ids} not planned" for key, ids in by_key.items() if key not in planned]
    if accounted:
        found["accounted"] = accounted
    asked = {p.job_id for p in plan if p.cancel_outcome is not None}
    # a dependency cascade's cancel (ParentFailed) is the database's, checked by inv_parent_failed_has_failed_parent
    phantom = [f"{job_id}: {status} without an operator cancel" for job_id, _, status, _, error_class in jobs
               if status in ("cancelled", "abandoned") and job_id not in asked and error_class != "ParentFailed"]
    if phantom:
        found["cancelled_by_operator"] = phantom
    return found


def _is_uuid(text: str) -> bool:
    try:
        UUID(text)
    except ValueError:
        return False
    return True


async def corrupt_one_row(dsn: str) -> str:
    """Store, on one succeeded job, the result of another execution of it (or of another job): exactly
    what a zombie write that got past the fence would leave. The checks must name it."""
    rows = await fetch(dsn, "SELECT j.id, e.result, e.job_id = j.id FROM taskq.jobs j JOIN chaos.effects e "
                            "ON e.result IS NOT NULL AND e.token::text <> j.result->>'token' "
                            "WHERE j.status = 'succeeded' ORDER BY e.job_id = j.id DESC LIMIT 1")
    if not rows:
        return "nothing to corrupt"
    job_id, result, same_job = rows[0]
    await fetch(dsn, "UPDATE taskq.jobs SET result = %s::jsonb WHERE id = %s", Jsonb(result), job_id)
    whose = "a fenced-out execution of it" if same_job else "an execution of another job"
    return f"job {job_id} now holds the result of {whose}"
