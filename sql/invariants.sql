-- Invariant checks over jobs, job_events and job_attempts (taskq.invariants). Each query returns
-- the offending rows as (job_id, detail); an empty result means the invariant holds.

-- name: inv_stuck_running
-- A running row whose lease (its own lock from the claim and its worker's lease, whichever is later)
-- ran out long ago and that no sweeper reclaimed: a lost job.
SELECT j.id AS job_id,
       format('running, lease expired at %%s', greatest(j.lock_expires_at, w.lease_expires_at)) AS detail
FROM taskq.jobs AS j LEFT JOIN taskq.workers AS w ON w.id = j.worker_id
WHERE j.status = 'running'
  AND greatest(j.lock_expires_at, w.lease_expires_at) < now() - %(stale_after)s::float8 * interval '1 second';

-- name: inv_terminal_events
-- Exactly one terminal state_change per terminal job since its last requeue (an operator's requeue
-- starts a new run), none for an unfinished one.
SELECT j.id AS job_id, format('status %%s with %%s terminal state changes', j.status, count(e.id)) AS detail
FROM taskq.jobs AS j
LEFT JOIN taskq.job_events AS e
       ON e.job_id = j.id AND e.kind = 'state_change'
      AND e.to_status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
      AND e.id > coalesce((SELECT max(r.id) FROM taskq.job_events AS r
                           WHERE r.job_id = j.id AND r.kind = 'requeued'), 0)
GROUP BY j.id, j.status
HAVING count(e.id) <> CASE WHEN j.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
                           THEN 1 ELSE 0 END;

-- name: inv_success_from_current_attempt
-- A succeeded row's result came from its latest attempt, and no other attempt claims success.
SELECT j.id AS job_id,
       format('attempt %%s succeeded but attempts say %%s', j.attempt,
              string_agg(a.attempt || ':' || coalesce(a.outcome, 'open'), ',' ORDER BY a.claim_epoch)) AS detail
FROM taskq.jobs AS j JOIN taskq.job_attempts AS a ON a.job_id = j.id
GROUP BY j.id, j.attempt, j.status, j.claim_epoch
HAVING count(*) FILTER (WHERE a.outcome = 'succeeded') <> CASE WHEN j.status = 'succeeded' THEN 1 ELSE 0 END
    OR (j.status = 'succeeded'
        AND max(a.claim_epoch) FILTER (WHERE a.outcome = 'succeeded') <> j.claim_epoch);

-- name: inv_cancel_has_request
-- cancelled and abandoned rows always carry a real cancel request (shutdown never fabricates one).
SELECT id AS job_id, format('%%s without cancel_requested_at', status) AS detail
FROM taskq.jobs
WHERE status IN ('cancelled', 'abandoned') AND cancel_requested_at IS NULL;

-- name: inv_abandoned_not_by_shutdown
SELECT e.job_id, 'abandoned by a shutdown path' AS detail
FROM taskq.job_events AS e
WHERE e.kind = 'state_change' AND e.to_status = 'abandoned' AND e.detail ->> 'cause' = 'shutdown';

-- name: inv_attempts_not_refunded
-- Every claim wrote one attempts row with the next attempt number: the row's attempt equals the
-- number of claims, and attempt numbers rise with claim_epoch.
SELECT j.id AS job_id,
       format('attempt %%s, claim_epoch %%s, %%s attempt rows, numbers %%s', j.attempt, j.claim_epoch, count(a.*),
              string_agg(a.attempt::text, ',' ORDER BY a.claim_epoch)) AS detail
FROM taskq.jobs AS j LEFT JOIN taskq.job_attempts AS a ON a.job_id = j.id
GROUP BY j.id, j.attempt, j.claim_epoch
HAVING count(a.*) <> j.attempt OR count(a.*) <> j.claim_epoch
    OR array_agg(a.attempt ORDER BY a.claim_epoch) FILTER (WHERE a.attempt IS NOT NULL)
       <> ARRAY(SELECT generate_series(1, j.attempt));

-- name: inv_interrupts_match_releases
SELECT j.id AS job_id,
       format('interrupt_count %%s but %%s release events', j.interrupt_count, count(e.id)) AS detail
FROM taskq.jobs AS j
LEFT JOIN taskq.job_events AS e
       ON e.job_id = j.id AND e.kind = 'state_change' AND (e.detail ->> 'released')::boolean
GROUP BY j.id, j.interrupt_count
HAVING count(e.id) <> j.interrupt_count;

-- name: inv_timeline_chained
-- A job that left the queue has a timeline; each state change (a requeue, a snooze, a sleep or a wait for a
-- signal is one) starts where
-- the previous one ended, and the last one ends at the row's status.
WITH changes AS (
    SELECT e.job_id, e.id, e.at, e.from_status, e.to_status,
           lag(e.to_status) OVER w AS prev_to, lag(e.at) OVER w AS prev_at
    FROM taskq.job_events AS e
    WHERE e.kind IN ('state_change', 'requeued', 'snoozed', 'sleeping', 'waiting')
    WINDOW w AS (PARTITION BY e.job_id ORDER BY e.id)
), broken AS (
    SELECT job_id, format('event %%s goes %%s -> %%s after -> %%s', id, from_status, to_status, prev_to) AS detail
    FROM changes
    WHERE (prev_to IS NOT NULL AND from_status <> prev_to) OR (prev_at IS NOT NULL AND at < prev_at)
), last_change AS (
    SELECT DISTINCT ON (job_id) job_id, to_status FROM changes ORDER BY job_id, id DESC
)
SELECT job_id, detail FROM broken
UNION ALL
SELECT j.id, format('row is %%s but its last state change ends at %%s', j.status, coalesce(l.to_status, 'nothing'))
FROM taskq.jobs AS j LEFT JOIN last_change AS l ON l.job_id = j.id
-- (a job still waiting for its parents, like one still pending, may have no state change yet)
WHERE (j.status NOT IN ('pending', 'scheduled', 'awaiting_parents') OR j.attempt > 0)
  AND l.to_status IS DISTINCT FROM j.status;

-- name: inv_one_job_per_slot
-- At most one job per schedule slot (operator triggers are outside the slot sequence: no unique key).
SELECT (array_agg(id ORDER BY created_at, id))[2] AS job_id,
       format('schedule %%s slot %%s has %%s jobs', schedule, scheduled_for, count(*)) AS detail
FROM taskq.jobs
WHERE schedule IS NOT NULL AND unique_key IS NOT NULL
GROUP BY schedule, scheduled_for
HAVING count(*) > 1;

-- name: inv_requeues_have_events
-- Every requeue the row counts has its 'requeued' event, and no event is without one.
SELECT j.id AS job_id, format('requeue_count %%s but %%s requeued events', j.requeue_count, count(e.id)) AS detail
FROM taskq.jobs AS j
LEFT JOIN taskq.job_events AS e ON e.job_id = j.id AND e.kind = 'requeued'
GROUP BY j.id, j.requeue_count
HAVING count(e.id) <> j.requeue_count;

-- name: inv_requeue_monotonic
-- A requeue keeps attempt and claim_epoch: the event records the attempt of the claim it followed,
-- the row never goes below them afterwards, and every later claim numbers on from there.
SELECT e.job_id,
       format('requeue event %%s at attempt %%s, claim_epoch %%s; row at attempt %%s, claim_epoch %%s%%s',
              e.id, e.attempt, e.detail ->> 'claim_epoch', j.attempt, j.claim_epoch,
              CASE WHEN bad.claim_epoch IS NOT NULL
                   THEN format(', later claim %%s numbered %%s', bad.claim_epoch, bad.attempt) ELSE '' END) AS detail
FROM taskq.job_events AS e
JOIN taskq.jobs AS j ON j.id = e.job_id
LEFT JOIN LATERAL (
    SELECT a.claim_epoch, a.attempt FROM taskq.job_attempts AS a
    WHERE a.job_id = e.job_id AND a.claim_epoch > (e.detail ->> 'claim_epoch')::bigint AND a.attempt <= e.attempt
    LIMIT 1
) AS bad ON true
WHERE e.kind = 'requeued'
  AND (e.attempt > j.attempt OR (e.detail ->> 'claim_epoch')::bigint > j.claim_epoch OR bad.claim_epoch IS NOT NULL
       -- (a child the dependency cascade cancelled before it ever ran is requeued at attempt 0)
       OR (e.attempt > 0 AND NOT EXISTS (SELECT 1 FROM taskq.job_attempts AS a
                      WHERE a.job_id = e.job_id AND a.claim_epoch = (e.detail ->> 'claim_epoch')::bigint
                        AND a.attempt = e.attempt)));

-- name: inv_unique_key_single_holder
-- At most one non-terminal job per unique key, and a retained row shares its key with no other live
-- or retained row (jobs_unique_key_idx enforces it; this proves it on the data).
SELECT id AS job_id, format('unique key %%s held by %%s jobs at once', unique_key, holders) AS detail
FROM (SELECT id, unique_key, count(*) OVER (PARTITION BY unique_key) AS holders
      FROM taskq.jobs
      WHERE unique_key IS NOT NULL
        AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'))) AS held
WHERE holders > 1;

-- name: inv_snoozes_counted
-- Every snooze is on record three ways that agree: the row's snooze_count, one `snoozed` event and one
-- `snoozed` attempts row.
WITH ev AS (
    SELECT job_id, count(*) AS n FROM taskq.job_events WHERE kind = 'snoozed' GROUP BY job_id
), att AS (
    SELECT job_id, count(*) AS n FROM taskq.job_attempts WHERE outcome = 'snoozed' GROUP BY job_id
)
SELECT j.id AS job_id,
       format('snooze_count %%s, %%s snoozed events, %%s snoozed attempts rows', j.snooze_count,
              coalesce(ev.n, 0), coalesce(att.n, 0)) AS detail
FROM taskq.jobs AS j LEFT JOIN ev ON ev.job_id = j.id LEFT JOIN att ON att.job_id = j.id
WHERE j.snooze_count <> coalesce(ev.n, 0) OR j.snooze_count <> coalesce(att.n, 0);

-- name: inv_claims_monotonic
-- attempt and claim_epoch rise with every claim, through retries, releases, snoozes and requeues: each
-- claim event (into running from another status) carries a higher attempt and claim epoch than the last.
WITH claims AS (
    SELECT e.job_id, e.id, e.attempt, (e.detail ->> 'claim_epoch')::bigint AS epoch,
           lag(e.attempt) OVER w AS prev_attempt, lag((e.detail ->> 'claim_epoch')::bigint) OVER w AS prev_epoch
    FROM taskq.job_events AS e
    WHERE e.kind = 'state_change' AND e.to_status = 'running' AND e.from_status <> 'running'
    WINDOW w AS (PARTITION BY e.job_id ORDER BY e.id)
)
SELECT job_id, format('claim event %%s: attempt %%s epoch %%s after attempt %%s epoch %%s', id, attempt, epoch,
                      prev_attempt, prev_epoch) AS detail
FROM claims
WHERE attempt <= prev_attempt OR epoch <= prev_epoch;

-- name: inv_awaiting_parents_settled
-- No job waits for parents that are all terminal (or gone). The cascade runs in the parents' own terminal
-- transactions, up to taskq.settle_chunk() edges each; the only lag allowed is a child whose unresolved edge
-- is to a parent in taskq.dependency_backlog (queued in that same transaction, settled by the resolvers).
SELECT j.id AS job_id,
       format('awaiting_parents (remaining %%s) but its %%s parent(s) are terminal', j.parents_remaining,
              count(d.parent_id)) AS detail
FROM taskq.jobs AS j
LEFT JOIN taskq.job_dependencies AS d ON d.child_id = j.id
LEFT JOIN taskq.jobs AS p ON p.id = d.parent_id
WHERE j.status = 'awaiting_parents'
  AND NOT EXISTS (SELECT 1 FROM taskq.job_dependencies AS u JOIN taskq.dependency_backlog AS b
                  ON b.parent_id = u.parent_id WHERE u.child_id = j.id AND u.resolved_at IS NULL)
GROUP BY j.id, j.parents_remaining
HAVING coalesce(bool_and(p.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
                         OR p.id IS NULL), true);

-- name: inv_parent_failed_has_failed_parent
-- Every ParentFailed row has a parent that ended other than succeeded (as its edge recorded when it resolved).
SELECT j.id AS job_id, format('%%s ParentFailed (%%s) without a parent that ended in failure', j.status,
                              j.cancel_reason) AS detail
FROM taskq.jobs AS j
WHERE j.error_class = 'ParentFailed'
  AND NOT EXISTS (SELECT 1 FROM taskq.job_dependencies AS d
                  WHERE d.child_id = j.id AND d.parent_status IN ('failed', 'cancelled', 'crashed', 'abandoned')
                    AND j.cancel_reason = 'parent-failure:' || d.parent_status);

-- name: inv_parents_remaining_matches_edges
-- A waiting job's remaining count is its number of unresolved edges, and every unresolved edge's parent
-- is not terminal (an edge is resolved in the parent's terminal transaction), or is in the backlog (its
-- terminal transaction left edges beyond its chunk to the resolvers).
SELECT j.id AS job_id,
       format('parents_remaining %%s, unresolved edges %%s, of them to terminal parents %%s', j.parents_remaining,
              count(d.parent_id) FILTER (WHERE d.resolved_at IS NULL),
              count(d.parent_id) FILTER (WHERE d.resolved_at IS NULL
                                         AND p.status IN ('succeeded', 'failed', 'cancelled', 'crashed',
                                                          'abandoned'))) AS detail
FROM taskq.jobs AS j
LEFT JOIN taskq.job_dependencies AS d ON d.child_id = j.id
LEFT JOIN taskq.jobs AS p ON p.id = d.parent_id
LEFT JOIN (SELECT DISTINCT parent_id FROM taskq.dependency_backlog) AS b ON b.parent_id = d.parent_id
WHERE j.status = 'awaiting_parents'
GROUP BY j.id, j.parents_remaining
HAVING j.parents_remaining <> count(d.parent_id) FILTER (WHERE d.resolved_at IS NULL)
    OR count(d.parent_id) FILTER (WHERE d.resolved_at IS NULL AND b.parent_id IS NULL
                                  AND p.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')) > 0;

-- name: inv_global_limit
-- No global concurrency limit is exceeded now: the running rows of each limited queue, actor and key
-- (per-key limits) are at most the limit. One row per scope over its limit, naming one of its running
-- jobs. (An operator who lowers a limit below what is running sees it here until enough jobs finish:
-- setting a limit stops no running job.)
WITH over AS (
    SELECT 'queue ' || q.name AS scope, q.concurrency_limit AS lim, count(*) AS n, min(j.id::text)::uuid AS job_id
    FROM taskq.queues AS q JOIN taskq.jobs AS j ON j.queue = q.name AND j.status = 'running'
    WHERE q.concurrency_limit IS NOT NULL GROUP BY q.name, q.concurrency_limit
    UNION ALL
    SELECT 'queue ' || q.name || ' key ' || j.concurrency_key, q.concurrency_per_key, count(*), min(j.id::text)::uuid
    FROM taskq.queues AS q JOIN taskq.jobs AS j
         ON j.queue = q.name AND j.status = 'running' AND j.concurrency_key IS NOT NULL
    WHERE q.concurrency_per_key IS NOT NULL GROUP BY q.name, q.concurrency_per_key, j.concurrency_key
    UNION ALL
    SELECT 'actor ' || a.actor, a.global_concurrency, count(*), min(j.id::text)::uuid
    FROM taskq.actor_limits AS a JOIN taskq.jobs AS j ON j.actor = a.actor AND j.status = 'running'
    WHERE a.global_concurrency IS NOT NULL GROUP BY a.actor, a.global_concurrency
    UNION ALL
    SELECT 'actor ' || a.actor || ' key ' || j.concurrency_key, a.concurrency_per_key, count(*), min(j.id::text)::uuid
    FROM taskq.actor_limits AS a JOIN taskq.jobs AS j
         ON j.actor = a.actor AND j.status = 'running' AND j.concurrency_key IS NOT NULL
    WHERE a.concurrency_per_key IS NOT NULL GROUP BY a.actor, a.concurrency_per_key, j.concurrency_key
)
SELECT job_id, format('%%s: %%s running, limit %%s', scope, n, lim) AS detail FROM over WHERE n > lim;

-- name: inv_class_capacity
-- No worker ever held more jobs of an isolation class than its capacity: from the attempts rows (each job
-- held from its claim, started_at, to its outcome's write, finished_at) of every registered worker, and the
-- capacities and actor classes it registered (taskq.workers). A job of an actor the worker did not know
-- counts on the async class of a worker with actors of several classes, else on its only class (its
-- claims). Thread and process jobs: at most the capacity. Async jobs: at most twice the capacity, because an
-- async slot is lent to the next claim while the outcome of the job that had it is being written (the
-- worker's completer; decisions.free_slots), so the rows held, not the actors running, reach that bound.
-- Only what can be known is checked: the workers still registered (a worker's row goes when it stops) and
-- the attempts whose job is still there (its actor names its class). One row per worker and class over its
-- capacity, at the peak, naming the job whose claim reached it.
WITH w AS (
    SELECT id, actor_isolation,
           jsonb_build_object('async', 2 * capacity_async, 'thread', capacity_thread,
                              'process', capacity_process) AS bound,
           (SELECT CASE WHEN count(DISTINCT v) = 1 THEN min(v) ELSE 'async' END
            FROM jsonb_each_text(actor_isolation) AS e(k, v)) AS stray
    FROM taskq.workers
    WHERE actor_isolation IS NOT NULL
), held AS (
    SELECT a.job_id, a.worker_id, a.started_at, coalesce(a.finished_at, 'infinity') AS finished_at,
           coalesce(w.actor_isolation ->> j.actor, w.stray) AS cls
    FROM taskq.job_attempts AS a JOIN w ON w.id = a.worker_id JOIN taskq.jobs AS j ON j.id = a.job_id
), edges AS (
    SELECT worker_id, cls, started_at AS at, 1 AS delta, job_id FROM held
    UNION ALL
    SELECT worker_id, cls, finished_at, -1, job_id FROM held
), counted AS (
    -- at the same instant an end counts before a start
    SELECT worker_id, cls, at, delta, job_id,
           sum(delta) OVER (PARTITION BY worker_id, cls ORDER BY at, delta ROWS UNBOUNDED PRECEDING) AS n
    FROM edges
)
SELECT DISTINCT ON (c.worker_id, c.cls) c.job_id,
       format('worker %%s held %%s %%s jobs at once at %%s, over its %%s capacity (%%s%%s)', c.worker_id, c.n, c.cls,
              c.at, c.cls, (w.bound ->> c.cls)::int / CASE WHEN c.cls = 'async' THEN 2 ELSE 1 END,
              CASE WHEN c.cls = 'async' THEN ', twice that allowed while outcomes are written' ELSE '' END) AS detail
FROM counted AS c JOIN w ON w.id = c.worker_id
WHERE c.delta = 1 AND c.n > (w.bound ->> c.cls)::int
ORDER BY c.worker_id, c.cls, c.n DESC, c.at;

-- name: inv_step_by_holder
-- A step, sleep or wait is stored only by the attempt that held the job at that moment (sql/durable.sql
-- fences it): the attempt and claim epoch it names are one of the job's claims, it was stored after that
-- claim, and no later claim of the job started before it was stored.
SELECT s.job_id, format('%%s %%s stored by attempt %%s epoch %%s at %%s: %%s', s.kind, s.name, s.attempt,
                        s.claim_epoch, s.created_at,
                        CASE WHEN a.job_id IS NULL THEN 'no such claim'
                             WHEN s.created_at < a.started_at THEN 'before that claim'
                             ELSE 'after a later claim started' END) AS detail
FROM taskq.job_steps AS s
LEFT JOIN taskq.job_attempts AS a
       ON a.job_id = s.job_id AND a.claim_epoch = s.claim_epoch AND a.attempt = s.attempt
WHERE a.job_id IS NULL OR s.created_at < a.started_at
   OR EXISTS (SELECT 1 FROM taskq.job_attempts AS later
              WHERE later.job_id = s.job_id AND later.claim_epoch > s.claim_epoch
                AND later.started_at < s.created_at);

-- name: inv_signal_taken_once
-- Every signal taken was taken once, by one wait that remembers it: a taken signal names the wait that took
-- it, and exactly one stored wait of its job holds its id; no wait holds a signal that is not marked taken.
SELECT g.job_id, format('signal %%s (%%s) taken by %%s, held by %%s waits', g.id, g.name, g.consumed_by,
                        (SELECT count(*) FROM taskq.job_steps AS s
                         WHERE s.job_id = g.job_id AND s.kind = 'signal'
                           AND (s.result ->> 'signal_id')::bigint = g.id)) AS detail
FROM taskq.job_signals AS g
WHERE g.consumed_at IS NOT NULL
  AND (SELECT count(*) FROM taskq.job_steps AS s
       WHERE s.job_id = g.job_id AND s.kind = 'signal' AND s.name = g.consumed_by
         AND (s.result ->> 'signal_id')::bigint = g.id) <> 1
UNION ALL
SELECT s.job_id, format('wait %%s holds signal %%s, which is not marked taken by it', s.name,
                        s.result ->> 'signal_id')
FROM taskq.job_steps AS s
WHERE s.kind = 'signal' AND s.result ? 'signal_id'
  AND NOT EXISTS (SELECT 1 FROM taskq.job_signals AS g
                  WHERE g.id = (s.result ->> 'signal_id')::bigint AND g.job_id = s.job_id
                    AND g.consumed_by = s.name);

-- name: inv_suspended_holds_nothing
-- A job suspended in a sleep or a wait for a signal holds no worker and no lease.
SELECT id AS job_id, format('suspended (%%s) but held by %%s until %%s', wait_kind, worker_id, lock_expires_at)
FROM taskq.jobs
WHERE status = 'scheduled' AND wait_kind IS NOT NULL AND (worker_id IS NOT NULL OR lock_expires_at IS NOT NULL);

-- name: inv_summary_status
SELECT status, count(*) AS n FROM taskq.jobs GROUP BY status ORDER BY status;

-- name: inv_summary_executions
SELECT attempts, count(*) AS jobs
FROM (SELECT j.id, count(a.*) AS attempts FROM taskq.jobs AS j
      LEFT JOIN taskq.job_attempts AS a ON a.job_id = j.id GROUP BY j.id) AS per_job
GROUP BY attempts ORDER BY attempts;
