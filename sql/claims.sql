-- The worker's claim (taskq.backend.workers): one statement takes a batch of due jobs, with the queue
-- control that decides which may be taken (pauses, fleet-wide limits). Parameters are psycopg %(name)s.

-- name: job_claim
-- Claim up to %(limit)s due jobs of our queues, most urgent first (and in a fair queue by fair_tag among jobs of
-- one priority: sql/0016_fair_claims.sql); one attempts row and one event each.
-- One ordered index scan per queue (jobs_claim_idx), each stopping at the limit: `queue = ANY(...)`
-- would read and sort the whole backlog on every claim. With several queues, the rows one queue's
-- scan locked but the final LIMIT leaves out are unlocked again at commit, untouched.
-- The LIMIT on the queue list never cuts it; it is there for the planner. Planning this statement
-- costs more than running it on a short queue (0.15 ms warm, 0.35 ms from an idle CPU), so the prepared
-- statement should keep a generic plan. PostgreSQL keeps one only if it looks no dearer than the custom
-- plans, and without the LIMIT a generic plan assumes ten queues (ten index scans). A LIMIT that is not a
-- constant is taken to keep a tenth of the rows, and with a long backlog that guess makes the generic plan
-- look dear: PostgreSQL went back to custom plans, one planning per claim (~3 us per job claimed). So the
-- worker writes %(limit)s in as a number (taskq.backend.workers.claim_statement: one prepared statement per
-- claim size), and the generic plan of each knows its limit.
-- Queue control: this statement takes no work of a controlled queue (paused, or limited) and no job of a
-- limited actor (taskq.actor_limits): the first is left to nobody while paused and to job_claim_limited
-- otherwise, the second to job_claim_limited. Both lists are read once per statement (an InitPlan over
-- two tiny tables), so a pause holds at the next claim of every worker, whether or not it heard of it.
-- The actor test is a CASE on purpose: as `actor <> ALL(...)` the planner estimates it from the actor
-- column's statistics (one actor in the queue: it would reject every row), and a queue whose backlog is
-- one actor's then gets a sequential scan and a sort of the whole backlog instead of the index scan.
-- As a CASE it gets a default estimate, and with no actor limit at all it tests nothing per row.
WITH picked AS (
    SELECT c.id, c.prev
    FROM (SELECT DISTINCT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, status AS prev, priority, fair_tag, scheduled_at FROM taskq.jobs
        WHERE status IN ('pending', 'scheduled') AND queue = q.name AND scheduled_at <= now()
          AND CASE WHEN EXISTS (SELECT 1 FROM taskq.actor_limits)
                   THEN actor <> ALL(ARRAY(SELECT actor FROM taskq.actor_limits)) ELSE true END
          AND q.name <> ALL(ARRAY(SELECT name FROM taskq.queues WHERE controlled))
        ORDER BY priority, fair_tag NULLS FIRST, scheduled_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = 'running',
        attempt = j.attempt + 1,
        claim_epoch = j.claim_epoch + 1,
        worker_id = %(worker_id)s,
        lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second',
        started_at = now(),
        cancel_phase = 0
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING j.id, j.actor, j.queue, j.payload, j.attempt, j.max_attempts, j.claim_epoch, j.progress,
              j.schedule_to_close, j.priority, p.prev, j.idempotent, j.scheduled_for, j.trace_context
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id)
    SELECT c.id, c.attempt, c.claim_epoch, %(worker_id)s FROM claimed AS c
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT c.id, 'state_change', c.prev, 'running', c.attempt, %(worker_id)s,
           jsonb_build_object('claim_epoch', c.claim_epoch)
    FROM claimed AS c
)
SELECT id, actor, queue, payload, attempt, max_attempts, claim_epoch, progress, schedule_to_close, idempotent,
       scheduled_for, trace_context
FROM claimed
ORDER BY priority, id;

-- name: job_claim_limited
-- The limited claim (sql/0012_queue_limits.sql): one statement, in autocommit. The function locks the
-- scopes (our queues, every limited actor: advisory locks, in key order), then counts and claims in its
-- next statement, whose snapshot is taken with the locks held, so the counts include every earlier
-- claimer's commit. Claims up to %(limit)s jobs of the work job_claim leaves (our unpaused limited queues,
-- and limited actors' jobs in our other unpaused queues), most urgent first, without passing any limit:
-- - concurrency (queue, actor): running rows now, from jobs_running_scope_idx;
-- - per key: running rows of the key; a key that is full is skipped in the scan, so it never holds up
--   the jobs behind it;
-- - rate: starts logged in rate_starts within the period before the claim's clock, read once after the
--   locks: claims of one scope are stamped in the order they hold its lock, and every window of the
--   period holds at most rate_limit starts.
-- A job that cannot start now is left as it is: no attempt is spent, any worker may take it later.
-- %(scan)s: rows read per scope at least (a claim for one slot still looks past a few full keys).
SELECT * FROM taskq.job_claim_limited_v16(%(queues)s::text[], %(limit)s::int, %(scan)s::int, %(worker_id)s::text,
                                          %(lock_timeout)s::float8, %(only)s::text[], %(except)s::text[]);

-- name: job_claim_queue_limited
-- job_claim_limited for the common case: our queues limited by concurrency or rate only (no per-key
-- limit) and no actor limit anywhere; it locks only our queues, and each queue's scan stops at what is
-- left of its limits, in claim order, as job_claim's does at the batch: no ranking. It takes nothing from
-- a queue with a per-key limit, nor anything at all once an actor limit exists; the worker then uses
-- job_claim_limited (its view of queue control says so by its next claim).
SELECT * FROM taskq.job_claim_queue_limited_v16(%(queues)s::text[], %(limit)s::int, %(worker_id)s::text,
                                                %(lock_timeout)s::float8, %(only)s::text[], %(except)s::text[]);

-- name: queue_control_read
-- What a worker needs to know to choose its claim: for each of our queues, paused or limited, and
-- whether any actor limit exists (its jobs may sit in any queue). Read at start, on a queue-control
-- NOTIFY and every poll_interval; the claims themselves never trust it (see job_claim).
SELECT name, paused_at IS NOT NULL AS paused, concurrency_limit, concurrency_per_key, rate_limit, rate_period
FROM taskq.queues WHERE name = ANY(%(queues)s::text[])
UNION ALL
SELECT NULL, NULL, count(*)::int, NULL, NULL, NULL FROM taskq.actor_limits;

-- name: actor_limits_sync
-- A starting worker writes the limits its code declares for its actors, and removes the limits of its
-- actors that declare none any more; the last worker to start wins. One NOTIFY when anything changed.
WITH d AS (
    SELECT * FROM unnest(%(actors)s::text[], %(concurrency)s::int[], %(per_key)s::int[], %(rate)s::int[],
                         %(period)s::float8[]) AS t(actor, global_concurrency, per_key, rate_limit, rate_period)
    ORDER BY actor
), up AS (
    INSERT INTO taskq.actor_limits AS a (actor, global_concurrency, concurrency_per_key, rate_limit, rate_period,
                                         declared_by)
    SELECT actor, global_concurrency, per_key, rate_limit, rate_period, %(by)s FROM d
    WHERE global_concurrency IS NOT NULL OR per_key IS NOT NULL OR rate_limit IS NOT NULL
    ON CONFLICT (actor) DO UPDATE SET
        global_concurrency = excluded.global_concurrency, concurrency_per_key = excluded.concurrency_per_key,
        rate_limit = excluded.rate_limit, rate_period = excluded.rate_period,
        declared_by = excluded.declared_by, updated_at = now()
    WHERE (a.global_concurrency, a.concurrency_per_key, a.rate_limit, a.rate_period)
          IS DISTINCT FROM (excluded.global_concurrency, excluded.concurrency_per_key, excluded.rate_limit,
                            excluded.rate_period)
    RETURNING actor
), gone AS (
    DELETE FROM taskq.actor_limits AS a USING d
    WHERE a.actor = d.actor AND d.global_concurrency IS NULL AND d.per_key IS NULL AND d.rate_limit IS NULL
    RETURNING a.actor
)
SELECT count(*) AS changed,
       (CASE WHEN count(*) > 0 THEN pg_notify('taskq_queues', '*') END) IS NULL AS _n
FROM (SELECT actor FROM up UNION ALL SELECT actor FROM gone) AS c;

-- name: job_claim_classes
-- A mixed worker's plain claim (its actors are of several isolation classes, each with its own capacity):
-- up to %(slots)s[c] jobs of each class c (1 async, 2 thread, 3 process), of the known %(actors)s only, each
-- actor in class %(classes)s[i] (same index), so that a full class never holds back another and no job is
-- claimed that would wait for a slot of its class. One ordered scan per (queue, actor) on
-- jobs_claim_actor_idx, in claim order, each stopping at its class's slots; the rows are then ranked per
-- class and each class keeps its slots' worth (the others, locked by a scan, are unlocked at commit,
-- untouched). The queue-control exclusions are job_claim's (controlled queues and limited actors are the
-- limited claim's), tested once per queue and per actor instead of per row. The LIMITs on the lists never
-- cut them; they are there for the planner (see job_claim).
-- The actor test is a range of one value, and the scan orders by actor first, on purpose: as `actor =
-- k.actor` the planner takes jobs_claim_idx (queue, priority, ...) just as well, filtering on the actor,
-- and so reads the whole backlog of the other actors of the queue ahead of this one's jobs (measured: 25,000
-- rows of a process actor read to claim 16 thread jobs). A range keeps the order on actor, which only
-- jobs_claim_actor_idx gives without a sort, and it is the same test.
WITH picked AS (
    SELECT r.id, r.prev
    FROM (
        SELECT c.id, c.prev, k.cls,
               row_number() OVER (PARTITION BY k.cls
                                  ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id) AS rank
        FROM (SELECT DISTINCT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
        CROSS JOIN (SELECT * FROM unnest(%(actors)s::text[], %(classes)s::int[])
                    LIMIT cardinality(%(actors)s::text[])) AS k(actor, cls)
        CROSS JOIN LATERAL (
            SELECT id, status AS prev, priority, fair_tag, scheduled_at FROM taskq.jobs
            WHERE status IN ('pending', 'scheduled') AND actor >= k.actor AND actor <= k.actor AND queue = q.name
              AND scheduled_at <= now()
            ORDER BY actor, priority, fair_tag NULLS FIRST, scheduled_at, id
            LIMIT (%(slots)s::int[])[k.cls]
            FOR UPDATE SKIP LOCKED
        ) AS c
        WHERE q.name <> ALL(ARRAY(SELECT name FROM taskq.queues WHERE controlled))
          AND k.actor <> ALL(ARRAY(SELECT actor FROM taskq.actor_limits))
    ) AS r
    WHERE r.rank <= (%(slots)s::int[])[r.cls]
), claimed AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = 'running',
        attempt = j.attempt + 1,
        claim_epoch = j.claim_epoch + 1,
        worker_id = %(worker_id)s,
        lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second',
        started_at = now(),
        cancel_phase = 0
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING j.id, j.actor, j.queue, j.payload, j.attempt, j.max_attempts, j.claim_epoch, j.progress,
              j.schedule_to_close, j.priority, p.prev, j.idempotent, j.scheduled_for, j.trace_context
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id)
    SELECT c.id, c.attempt, c.claim_epoch, %(worker_id)s FROM claimed AS c
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT c.id, 'state_change', c.prev, 'running', c.attempt, %(worker_id)s,
           jsonb_build_object('claim_epoch', c.claim_epoch)
    FROM claimed AS c
)
SELECT id, actor, queue, payload, attempt, max_attempts, claim_epoch, progress, schedule_to_close, idempotent,
       scheduled_for, trace_context
FROM claimed
ORDER BY priority, id;

-- name: job_claim_strays
-- A mixed worker's claim of jobs whose actor it does not know (not in %(known)s), which it fails at once
-- (UnknownActor) on its async slots: at most once per poll_interval, up to %(limit)s jobs. The distinct
-- actors with ready jobs come from a loose index scan of jobs_claim_actor_idx (one descent per actor, never
-- the backlog), then one ordered scan per (queue, stray actor) as in job_claim_classes (its actor range
-- too), with job_claim's queue-control exclusions.
WITH RECURSIVE ready AS (
    (SELECT actor FROM taskq.jobs WHERE status IN ('pending', 'scheduled') ORDER BY actor LIMIT 1)
    UNION ALL
    SELECT (SELECT j.actor FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.actor > r.actor ORDER BY j.actor LIMIT 1)
    FROM ready AS r WHERE r.actor IS NOT NULL
), picked AS (
    SELECT c.id, c.prev
    FROM (SELECT DISTINCT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
    CROSS JOIN (SELECT actor FROM ready
                WHERE actor IS NOT NULL AND actor <> ALL(%(known)s::text[])
                  AND actor <> ALL(ARRAY(SELECT actor FROM taskq.actor_limits))) AS k
    CROSS JOIN LATERAL (
        SELECT id, status AS prev, priority, fair_tag, scheduled_at FROM taskq.jobs
        WHERE status IN ('pending', 'scheduled') AND actor >= k.actor AND actor <= k.actor AND queue = q.name
          AND scheduled_at <= now()
        ORDER BY actor, priority, fair_tag NULLS FIRST, scheduled_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.name <> ALL(ARRAY(SELECT name FROM taskq.queues WHERE controlled))
    ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = 'running',
        attempt = j.attempt + 1,
        claim_epoch = j.claim_epoch + 1,
        worker_id = %(worker_id)s,
        lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second',
        started_at = now(),
        cancel_phase = 0
    FROM picked AS p
    WHERE j.id = p.id
    RETURNING j.id, j.actor, j.queue, j.payload, j.attempt, j.max_attempts, j.claim_epoch, j.progress,
              j.schedule_to_close, j.priority, p.prev, j.idempotent, j.scheduled_for, j.trace_context
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id)
    SELECT c.id, c.attempt, c.claim_epoch, %(worker_id)s FROM claimed AS c
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT c.id, 'state_change', c.prev, 'running', c.attempt, %(worker_id)s,
           jsonb_build_object('claim_epoch', c.claim_epoch)
    FROM claimed AS c
)
SELECT id, actor, queue, payload, attempt, max_attempts, claim_epoch, progress, schedule_to_close, idempotent,
       scheduled_for, trace_context
FROM claimed
ORDER BY priority, id;

-- name: fair_promote
-- Jobs of our fair queues written to start later and due now get their tag (sql/0016_fair_claims.sql);
-- run with the read of queue control, every poll_interval. Until then such a job is claimed after the
-- tagged jobs of its priority.
SELECT taskq.fair_promote_v16(%(queues)s::text[]) AS promoted;
