-- Queue control for operators (taskq.backend_queues): stats, pause/resume, limits, fairness weights and keys,
-- a waiting job's state.

-- name: queue_set_paused
-- Pause or resume one known queue (a taskq.queues row, or unfinished jobs naming it: its row is created
-- here). No row: unknown queue. `changed` false: it already was so. A change leaves a queue_events row
-- with who and why and sends a NOTIFY on taskq_queues (the queue's name) in the same transaction. The
-- claim statements read the row themselves, so a worker that misses the NOTIFY still obeys.
-- It takes the queue's claim lock (sql/0012_queue_limits.sql) first: it waits for the limited claim in
-- progress, and the claims after it wait for its commit and see it.
WITH lock AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(7461733, taskq.claim_scope_key('queue:' || %(name)s::text)) AS l
), target AS (
    SELECT %(name)s::text AS name FROM lock
    WHERE EXISTS (SELECT 1 FROM taskq.queues WHERE name = %(name)s)
       OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status IN ('pending', 'scheduled'))
       OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status = 'running')
), up AS (
    INSERT INTO taskq.queues AS q (name, paused_at, paused_by, pause_reason)
    SELECT name, CASE WHEN %(paused)s::bool THEN now() END, CASE WHEN %(paused)s::bool THEN %(by)s::text END,
           CASE WHEN %(paused)s::bool THEN %(reason)s::text END
    FROM target
    ON CONFLICT (name) DO UPDATE SET
        paused_at = CASE WHEN %(paused)s::bool THEN now() END,
        paused_by = CASE WHEN %(paused)s::bool THEN %(by)s::text END,
        pause_reason = CASE WHEN %(paused)s::bool THEN %(reason)s::text END,
        updated_at = now()
    WHERE (q.paused_at IS NOT NULL) <> %(paused)s::bool
    RETURNING q.name, (xmax = 0) AS inserted
), changed AS (
    SELECT name FROM up WHERE NOT inserted OR %(paused)s::bool
), ev AS (
    INSERT INTO taskq.queue_events (queue, kind, done_by, reason)
    SELECT name, CASE WHEN %(paused)s::bool THEN 'paused' ELSE 'resumed' END, %(by)s::text, %(reason)s::text
    FROM changed
)
SELECT (SELECT count(*) FROM target) > 0 AS known,
       (SELECT count(*) FROM changed) > 0 AS changed,
       (SELECT count(pg_notify('taskq_queues', name)) FROM changed) AS notified;

-- name: queue_set_limits
-- Set (or, with the value NULL, remove) some of a queue's limits; a flag per limit says whether to touch
-- it. Creates the queue's row (first use). Leaves a 'limits' event with the new values, and a NOTIFY.
-- The rate and its period are set together (the CHECK constraint ties them). Under the queue's claim
-- lock, as queue_set_paused.
WITH lock AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(7461733, taskq.claim_scope_key('queue:' || %(name)s::text)) AS l
), up AS (
    INSERT INTO taskq.queues AS q (name, concurrency_limit, concurrency_per_key, rate_limit, rate_period)
    SELECT %(name)s, %(concurrency)s::int, %(per_key)s::int, %(rate)s::int, %(period)s::float8 FROM lock
    ON CONFLICT (name) DO UPDATE SET
        concurrency_limit = CASE WHEN %(set_concurrency)s::bool THEN %(concurrency)s::int ELSE q.concurrency_limit END,
        concurrency_per_key = CASE WHEN %(set_per_key)s::bool THEN %(per_key)s::int ELSE q.concurrency_per_key END,
        rate_limit = CASE WHEN %(set_rate)s::bool THEN %(rate)s::int ELSE q.rate_limit END,
        rate_period = CASE WHEN %(set_rate)s::bool THEN %(period)s::float8 ELSE q.rate_period END,
        updated_at = now()
    RETURNING q.name, q.concurrency_limit, q.concurrency_per_key, q.rate_limit, q.rate_period
), ev AS (
    INSERT INTO taskq.queue_events (queue, kind, done_by, reason, detail)
    SELECT name, 'limits', %(by)s::text, %(reason)s::text,
           jsonb_build_object('concurrency', concurrency_limit, 'concurrency_per_key', concurrency_per_key,
                              'rate_limit', rate_limit, 'rate_period', rate_period)
    FROM up
)
SELECT name, concurrency_limit, concurrency_per_key, rate_limit, rate_period,
       pg_notify('taskq_queues', name) IS NULL AS _n
FROM up;

-- name: queue_stats
-- `taskq queues`. Every figure reads only index entries of the rows it counts, never the whole table:
-- waiting rows from jobs_claim_idx (pending/scheduled, with scheduled_at in the index: due now or later,
-- and the oldest due), running rows from jobs_running_scope_idx, waiting parents from
-- jobs_awaiting_queue_idx, the last hour's failures and the last 5 minutes' finishes from the retention
-- indexes (finished_at ranges), the weights from taskq.fairness_weights (its primary key). Queues: the
-- taskq.queues rows and any queue with unfinished jobs.
WITH waiting AS (
    SELECT queue,
           count(*) FILTER (WHERE scheduled_at <= now()) AS pending,
           count(*) FILTER (WHERE scheduled_at > now()) AS scheduled,
           min(scheduled_at) FILTER (WHERE scheduled_at <= now()) AS oldest_due
    FROM taskq.jobs WHERE status IN ('pending', 'scheduled')
    GROUP BY queue
), running AS (
    SELECT queue, count(*) AS running FROM taskq.jobs WHERE status = 'running' AND queue IS NOT NULL GROUP BY queue
), awaiting AS (
    SELECT queue, count(*) AS awaiting FROM taskq.jobs WHERE status = 'awaiting_parents' GROUP BY queue
), failed AS (
    SELECT queue, count(*) AS failed FROM taskq.jobs
    WHERE status IN ('failed', 'crashed', 'abandoned') AND finished_at > now() - interval '1 hour'
    GROUP BY queue
), finished AS (
    SELECT queue, sum(n) AS finished FROM (
        SELECT queue, count(*) AS n FROM taskq.jobs
        WHERE status IN ('succeeded', 'cancelled') AND finished_at > now() - interval '5 minutes'
        GROUP BY queue
        UNION ALL
        SELECT queue, count(*) FROM taskq.jobs
        WHERE status IN ('failed', 'crashed', 'abandoned') AND finished_at > now() - interval '5 minutes'
        GROUP BY queue
    ) AS f GROUP BY queue
), names AS (
    SELECT name FROM taskq.queues
    UNION SELECT queue FROM waiting UNION SELECT queue FROM running UNION SELECT queue FROM awaiting
)
SELECT n.name,
       coalesce(w.pending, 0) AS pending, coalesce(w.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running, coalesce(a.awaiting, 0) AS awaiting_parents,
       coalesce(f.failed, 0) AS failed_last_hour,
       extract(epoch FROM now() - w.oldest_due)::float8 AS oldest_pending_age,
       coalesce(d.finished, 0)::float8 / 300.0 AS throughput,
       q.paused_at IS NOT NULL AS paused, q.paused_at, q.paused_by, q.pause_reason,
       q.concurrency_limit, q.concurrency_per_key, q.rate_limit, q.rate_period,
       (SELECT jsonb_object_agg(w.key, w.weight) FROM taskq.fairness_weights AS w
        WHERE w.queue = n.name) AS fairness_weights
FROM names AS n
LEFT JOIN taskq.queues AS q ON q.name = n.name
LEFT JOIN waiting AS w ON w.queue = n.name
LEFT JOIN running AS r ON r.queue = n.name
LEFT JOIN awaiting AS a ON a.queue = n.name
LEFT JOIN failed AS f ON f.queue = n.name
LEFT JOIN finished AS d ON d.queue = n.name
ORDER BY n.name;

-- name: actor_limits_list
-- The actor limits in force, with each actor's running rows (jobs_running_scope_idx).
SELECT a.actor, a.global_concurrency, a.concurrency_per_key, a.rate_limit, a.rate_period, a.declared_by,
       a.updated_at,
       (SELECT count(*) FROM taskq.jobs AS j
        WHERE j.status = 'running' AND j.queue IS NOT NULL AND j.actor = a.actor) AS running
FROM taskq.actor_limits AS a
ORDER BY a.actor;

-- name: queue_events
-- A queue's operator timeline, oldest first.
SELECT id, queue, at, kind, done_by, reason, detail FROM taskq.queue_events WHERE queue = %(name)s ORDER BY id;

-- name: job_wait_state
-- Why a waiting job has not started: its queue's pause and limits, its actor's limits, and how much of
-- each is in use now (running rows; starts within the rate period).
SELECT j.status, j.queue, j.actor, j.concurrency_key, j.scheduled_at <= now() AS due,
       q.paused_at, q.paused_by, q.pause_reason,
       q.concurrency_limit AS queue_concurrency, q.concurrency_per_key AS queue_per_key,
       q.rate_limit AS queue_rate, q.rate_period AS queue_period,
       (SELECT count(*) FROM taskq.jobs AS r WHERE r.status = 'running' AND r.queue = j.queue) AS queue_running,
       (SELECT count(*) FROM taskq.jobs AS r
        WHERE r.status = 'running' AND r.queue = j.queue AND r.concurrency_key = j.concurrency_key) AS queue_key_running,
       (SELECT count(*) FROM taskq.rate_starts AS s
        WHERE s.scope = 'queue:' || j.queue
          AND s.started_at > clock_timestamp() - q.rate_period * interval '1 second') AS queue_starts,
       a.global_concurrency AS actor_concurrency, a.concurrency_per_key AS actor_per_key,
       a.rate_limit AS actor_rate, a.rate_period AS actor_period,
       (SELECT count(*) FROM taskq.jobs AS r
        WHERE r.status = 'running' AND r.queue IS NOT NULL AND r.actor = j.actor) AS actor_running,
       (SELECT count(*) FROM taskq.jobs AS r
        WHERE r.status = 'running' AND r.queue IS NOT NULL AND r.actor = j.actor
          AND r.concurrency_key = j.concurrency_key) AS actor_key_running,
       (SELECT count(*) FROM taskq.rate_starts AS s
        WHERE s.scope = 'actor:' || j.actor
          AND s.started_at > clock_timestamp() - a.rate_period * interval '1 second') AS actor_starts
FROM taskq.jobs AS j
LEFT JOIN taskq.queues AS q ON q.name = j.queue
LEFT JOIN taskq.actor_limits AS a ON a.actor = j.actor
WHERE j.id = %(id)s;

-- name: queue_set_fairness_weight
-- Set the fairness weight of a key in a queue (key '' = the jobs enqueued without one): an upsert into
-- taskq.fairness_weights, or, for the default weight 1, the removal of the row. Marks the queue fair
-- (taskq.fair_queues) so that jobs without a key are tagged there from now on. Known queues only, as
-- queue_set_paused decides it (no row is written for an unknown one). Under the queue's claim lock, as
-- queue_set_limits. The caller then re-spaces the key's ready jobs (queue_fair_retag) in the same
-- transaction.
WITH lock AS MATERIALIZED (
    SELECT pg_advisory_xact_lock(7461733, taskq.claim_scope_key('queue:' || %(name)s::text)) AS l
), target AS (
    SELECT %(name)s::text AS name FROM lock
    WHERE EXISTS (SELECT 1 FROM taskq.queues WHERE name = %(name)s)
       OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status IN ('pending', 'scheduled'))
       OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status = 'running')
), previous AS (
    SELECT w.weight FROM taskq.fairness_weights AS w, target AS t WHERE w.queue = t.name AND w.key = %(key)s
), up AS (
    INSERT INTO taskq.fairness_weights AS w (queue, key, weight, updated_by)
    SELECT name, %(key)s::text, %(weight)s::float8, %(by)s::text FROM target WHERE %(weight)s::float8 <> 1
    ON CONFLICT (queue, key) DO UPDATE SET weight = excluded.weight, updated_at = now(), updated_by = excluded.updated_by
    RETURNING w.queue
), gone AS (
    DELETE FROM taskq.fairness_weights AS w USING target AS t
    WHERE w.queue = t.name AND w.key = %(key)s AND %(weight)s::float8 = 1
    RETURNING w.queue
), fair AS (
    INSERT INTO taskq.fair_queues (queue) SELECT name FROM target ON CONFLICT DO NOTHING
)
SELECT (SELECT count(*) FROM target) > 0 AS known,
       coalesce((SELECT weight FROM previous), 1.0)::float8 AS previous;

-- name: queue_fair_retag
-- After queue_set_fairness_weight, in its transaction: re-space the key's ready jobs by the new weight
-- (taskq.fair_retag_v16) and tell the workers (NOTIFY on taskq_queues, as a pause or a limit does).
SELECT taskq.fair_retag_v16(%(name)s, %(key)s) AS retagged, pg_notify('taskq_queues', %(name)s) IS NULL AS _n;

-- name: queue_fairness_weights
-- A queue's weights other than the default 1 (a small table, by its primary key).
SELECT key, weight, updated_at, updated_by FROM taskq.fairness_weights WHERE queue = %(name)s ORDER BY key;

-- name: queue_fair_keys
-- `taskq queues --keys QUEUE`: per fairness key of the queue ('' = jobs without one) its ready jobs (due
-- now), its jobs scheduled for later, its running jobs, the jobs started in the last minute and its weight.
-- Waiting rows come from jobs_claim_idx (the queue's slice of it), running rows from
-- jobs_running_scope_idx, and the jobs that finished in the last minute from the retention indexes
-- (finished_at ranges): a start in the last minute is a job now running, finished or back to waiting
-- whose started_at (its latest attempt's start) is within the minute. Keys with a weight and no job show
-- too.
WITH waiting AS (
    SELECT coalesce(fairness_key, '') AS key,
           count(*) FILTER (WHERE scheduled_at <= now()) AS ready,
           count(*) FILTER (WHERE scheduled_at > now()) AS scheduled,
           count(*) FILTER (WHERE started_at > now() - interval '1 minute') AS started
    FROM taskq.jobs WHERE status IN ('pending', 'scheduled') AND queue = %(name)s
    GROUP BY 1
), running AS (
    SELECT coalesce(fairness_key, '') AS key, count(*) AS running,
           count(*) FILTER (WHERE started_at > now() - interval '1 minute') AS started
    FROM taskq.jobs WHERE status = 'running' AND queue = %(name)s
    GROUP BY 1
), finished AS (
    SELECT key, sum(n) AS started FROM (
        SELECT coalesce(fairness_key, '') AS key, count(*) AS n FROM taskq.jobs
        WHERE status IN ('succeeded', 'cancelled') AND finished_at > now() - interval '1 minute'
          AND queue = %(name)s AND started_at > now() - interval '1 minute'
        GROUP BY 1
        UNION ALL
        SELECT coalesce(fairness_key, ''), count(*) FROM taskq.jobs
        WHERE status IN ('failed', 'crashed', 'abandoned') AND finished_at > now() - interval '1 minute'
          AND queue = %(name)s AND started_at > now() - interval '1 minute'
        GROUP BY 1
    ) AS f GROUP BY key
), weights AS (
    SELECT key, weight FROM taskq.fairness_weights WHERE queue = %(name)s
), keys AS (
    SELECT key FROM waiting UNION SELECT key FROM running UNION SELECT key FROM finished
    UNION SELECT key FROM weights
)
SELECT k.key, coalesce(w.ready, 0) AS ready, coalesce(w.scheduled, 0) AS scheduled,
       coalesce(r.running, 0) AS running,
       (coalesce(w.started, 0) + coalesce(r.started, 0) + coalesce(f.started, 0))::bigint AS started_last_minute,
       coalesce(g.weight, 1.0)::float8 AS weight
FROM keys AS k
LEFT JOIN waiting AS w ON w.key = k.key
LEFT JOIN running AS r ON r.key = k.key
LEFT JOIN finished AS f ON f.key = k.key
LEFT JOIN weights AS g ON g.key = k.key
ORDER BY coalesce(w.ready, 0) DESC, k.key
LIMIT %(limit)s;

-- name: job_fair_wait_state
-- What else a due waiting job may wait on: a free slot of its actor's isolation class on a live worker
-- serving its queue (the capacities and actor classes live workers registered, and the jobs each of them
-- runs now, by class), and its key's share: how many due waiting jobs of other keys of its queue come
-- before it in claim order (priority, fair_tag NULLS FIRST, scheduled_at, id), counted up to a cap.
WITH j AS (
    SELECT id, status, queue, actor, priority, fairness_key, fair_tag, scheduled_at, scheduled_at <= now() AS due
    FROM taskq.jobs WHERE id = %(id)s
), live AS (
    SELECT w.id, w.actor_isolation,
           w.actor_isolation ->> j.actor AS class,
           CASE w.actor_isolation ->> j.actor WHEN 'async' THEN w.capacity_async WHEN 'thread' THEN w.capacity_thread
                WHEN 'process' THEN w.capacity_process END AS capacity
    FROM taskq.workers AS w, j
    WHERE w.lease_expires_at > now() AND NOT w.stopping AND j.queue = ANY (w.queues)
), busy AS (
    SELECT l.id, l.class, l.capacity,
           (SELECT count(*) FROM taskq.jobs AS r
            WHERE r.status = 'running' AND r.worker_id = l.id AND l.actor_isolation ->> r.actor = l.class) AS running
    FROM live AS l WHERE l.class IS NOT NULL
)
SELECT j.status, j.queue, j.actor, j.fairness_key, j.fair_tag IS NOT NULL AS fair, j.due,
       (SELECT count(*) FROM live) AS live_workers,
       (SELECT count(*) FROM live WHERE actor_isolation IS NULL) AS unclassed_workers,
       (SELECT count(*) FROM busy) AS knowing_workers,
       (SELECT min(class) FROM busy) AS class,
       (SELECT count(*) FROM busy WHERE capacity IS NULL OR running < capacity) AS free_workers,
       (SELECT coalesce(sum(capacity), 0) FROM busy) AS slots,
       (SELECT coalesce(sum(running), 0) FROM busy) AS slots_busy,
       CASE WHEN j.fair_tag IS NULL OR NOT j.due OR j.status NOT IN ('pending', 'scheduled') THEN 0 ELSE (
           SELECT count(*) FROM (
               SELECT 1 FROM taskq.jobs AS r
               WHERE r.status IN ('pending', 'scheduled') AND r.queue = j.queue AND r.scheduled_at <= now()
                 AND coalesce(r.fairness_key, '') <> coalesce(j.fairness_key, '')
                 AND (r.priority < j.priority
                      OR (r.priority = j.priority
                          AND (r.fair_tag IS NULL OR (r.fair_tag, r.scheduled_at, r.id) < (j.fair_tag, j.scheduled_at, j.id))))
               LIMIT %(cap)s
           ) AS ahead) END AS ahead_other_keys
FROM j;
