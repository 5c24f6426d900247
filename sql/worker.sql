-- Queries used by the worker runtime (taskq.backend.workers). Parameters are psycopg %(name)s.
-- Every write to a claimed row is fenced on (id, status='running', attempt, claim_epoch).

-- name: worker_register
-- Also used by a heartbeat that found our row gone (a sweeper took us for dead): it comes back with
-- a fresh lease.
-- Its queues get their taskq.queues rows (first use) in the same statement.
WITH q AS (
    INSERT INTO taskq.queues (name) SELECT DISTINCT unnest(%(queues)s::text[]) ORDER BY 1
    ON CONFLICT (name) DO NOTHING
)
INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s,
        now() + %(lock_timeout)s::float8 * interval '1 second')
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), stopping = false,
    lease_expires_at = excluded.lease_expires_at;

-- name: worker_stopping
UPDATE taskq.workers SET stopping = true WHERE id = %(id)s;

-- name: worker_deregister
DELETE FROM taskq.workers WHERE id = %(id)s;

-- name: workers_clean_dead
-- Rows of workers long silent and holding nothing, then the lease losses nobody is left to read (a
-- live worker empties its own every tick; one whose row was removed reconciles every held row when it
-- comes back, so its losses are not needed either).
WITH gone AS (
    DELETE FROM taskq.workers
    WHERE last_heartbeat_at < now() - %(dead_after)s::float8 * interval '1 second'
      AND NOT EXISTS (SELECT 1 FROM taskq.jobs j WHERE j.worker_id = workers.id AND j.status = 'running')
    RETURNING id
)
DELETE FROM taskq.lease_losses AS l
WHERE l.worker_id IN (SELECT id FROM gone)
   OR NOT EXISTS (SELECT 1 FROM taskq.workers AS w WHERE w.id = l.worker_id);

-- name: job_claim
-- Claim up to %(limit)s due jobs of our queues, most urgent first; one attempts row and one event each.
-- One ordered index scan per queue (jobs_claim_idx), each stopping at the limit: `queue = ANY(...)`
-- would read and sort the whole backlog on every claim. With several queues, the rows one queue's
-- scan locked but the final LIMIT leaves out are unlocked again at commit, untouched.
-- The LIMIT on the queue list never cuts it; it is there for the planner. Planning this statement
-- costs more than running it on a short queue (0.15 ms warm, 0.35 ms from an idle CPU), so the prepared
-- statement should keep a generic plan. PostgreSQL keeps one only if it looks no dearer than the custom
-- plans, and without the LIMIT a generic plan assumes ten queues (ten index scans). A LIMIT that is not a
-- constant is taken to keep a tenth of the rows: one queue. With a long backlog the generic plan's
-- guess at the outer LIMIT makes it look dear, and PostgreSQL goes back to custom plans by itself.
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
        SELECT id, status AS prev, priority, scheduled_at FROM taskq.jobs
        WHERE status IN ('pending', 'scheduled') AND queue = q.name AND scheduled_at <= now()
          AND CASE WHEN EXISTS (SELECT 1 FROM taskq.actor_limits)
                   THEN actor <> ALL(ARRAY(SELECT actor FROM taskq.actor_limits)) ELSE true END
          AND q.name <> ALL(ARRAY(SELECT name FROM taskq.queues WHERE controlled))
        ORDER BY priority, scheduled_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority, c.scheduled_at, c.id
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
SELECT * FROM taskq.job_claim_limited(%(queues)s::text[], %(limit)s::int, %(scan)s::int, %(worker_id)s::text,
                                      %(lock_timeout)s::float8);

-- name: job_claim_queue_limited
-- job_claim_limited for the common case: our queues limited by concurrency or rate only (no per-key
-- limit) and no actor limit anywhere; it locks only our queues, and each queue's scan stops at what is
-- left of its limits, in claim order, as job_claim's does at the batch: no ranking. It takes nothing from
-- a queue with a per-key limit, nor anything at all once an actor limit exists; the worker then uses
-- job_claim_limited (its view of queue control says so by its next claim).
SELECT * FROM taskq.job_claim_queue_limited(%(queues)s::text[], %(limit)s::int, %(worker_id)s::text,
                                            %(lock_timeout)s::float8);

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

-- name: heartbeat
-- POLL_CANCEL_FLAGS_SQL, one round trip per tick whatever the number of jobs held: renew this worker's
-- lease (which holds every row it claimed), hand over the rows taken away from it since the last tick
-- (lease_losses), and return the cancel flags of the held rows that have a cancel request. Nothing here
-- visits a held row without a cancel request. kind: 'worker' (one row: is our workers row still there),
-- 'lost' (id, epoch), 'cancel' (id, epoch, cancel_phase).
WITH w AS (
    UPDATE taskq.workers SET last_heartbeat_at = now(),
        lease_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second'
    WHERE id = %(worker_id)s
    RETURNING id
), lost AS (
    DELETE FROM taskq.lease_losses WHERE worker_id = %(worker_id)s RETURNING job_id, claim_epoch
)
SELECT 'worker' AS kind, NULL::uuid AS id, (SELECT count(*) FROM w)::bigint AS epoch, NULL::smallint AS phase
UNION ALL
SELECT 'lost', job_id, claim_epoch, NULL FROM lost
UNION ALL
SELECT 'cancel', id, claim_epoch, cancel_phase FROM taskq.jobs
WHERE worker_id = %(worker_id)s AND status = 'running' AND cancel_requested_at IS NOT NULL;

-- name: heartbeat_reconcile
-- The slow path, for a tick that found our workers row gone (a sweeper took this worker for dead, for
-- example after a long freeze, and its lease losses may be gone with it): check every row we think we
-- hold, renew the lock of each one still ours (fenced on claim_epoch), and return its cancel flags.
-- A row missing from the result is lost.
UPDATE taskq.jobs AS j SET revision = j.revision + 1, lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second'
FROM unnest(%(ids)b::uuid[], %(epochs)b::bigint[]) AS h(id, epoch)
WHERE j.id = h.id AND j.claim_epoch = h.epoch AND j.status = 'running' AND j.worker_id = %(worker_id)s
RETURNING j.id, j.claim_epoch, j.cancel_phase;

-- name: job_finish_batch
-- Every outcome of an attempt, batched: succeeded / failed / cancelled / abandoned / crashed, or
-- 'scheduled' for a retry after retry_delay seconds (outcome 'retried'), or for a snooze (outcome
-- 'snoozed': the actor raised taskq.Snooze; it gives its attempt back to the budget, max_attempts + 1,
-- and its event is of kind 'snoozed'). Rows whose fence fails are left alone; the
-- caller counts them as stale writes. A cancelled verdict needs a real cancel request on the row.
-- A retry is never written over an operator's cancel request: an attempt that failed after the request
-- committed but before its worker saw it ends cancelled (the marker of the row's cancel phase), as the
-- sweeper and the shutdown release do; re-running it would drop the request the operator was told
-- had been initiated.
-- The arrays are sent in binary (the `b` placeholders): as text, every element would cost the worker
-- a regex escape.
WITH i AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(attempts)b::int[], %(epochs)b::bigint[], %(statuses)b::text[],
                         %(results)b::jsonb[], %(error_classes)b::text[], %(error_messages)b::text[],
                         %(retry_delays)b::float8[], %(outcomes)b::text[], %(details)b::jsonb[],
                         %(first_traces)b::jsonb[])
        AS t(id, attempt, epoch, status, result, error_class, error_message, retry_delay, outcome, detail,
             first_trace)
), upd AS (
    -- the cancel request is read from the locked row (not from the statement's snapshot), so a request
    -- that commits while this statement waits for the row lock is honoured too
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                      ELSE i.status END,
        result = CASE WHEN i.status = 'succeeded' THEN i.result ELSE j.result END,
        error_class = CASE WHEN i.status = 'succeeded' THEN NULL
                           WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NOT NULL
                           THEN CASE WHEN j.cancel_phase >= 2 THEN 'CancelledForced' ELSE 'CancelledCooperatively' END
                           ELSE i.error_class END,
        error_message = CASE WHEN i.status = 'succeeded' THEN NULL ELSE i.error_message END,
        finished_at = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
        scheduled_at = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL
                            THEN now() + i.retry_delay * interval '1 second' ELSE j.scheduled_at END,
        worker_id = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN NULL
                         ELSE j.worker_id END,
        lock_expires_at = NULL,
        cancel_phase = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN 0
                            WHEN i.error_class = 'CancelledForced' THEN 2 ELSE j.cancel_phase END,
        max_attempts = j.max_attempts
                       + CASE WHEN i.outcome = 'snoozed' AND j.cancel_requested_at IS NULL THEN 1 ELSE 0 END,
        snooze_count = j.snooze_count
                       + CASE WHEN i.outcome = 'snoozed' AND j.cancel_requested_at IS NULL THEN 1 ELSE 0 END,
        -- a traced retry: its attempt's span, for the later attempts' links (taskq.contrib.otel)
        trace_context = CASE WHEN i.first_trace IS NULL THEN j.trace_context
                             ELSE coalesce(j.trace_context, '{}'::jsonb) || i.first_trace END
    FROM i
    -- the fence on status is written as coalesce(j.status, '') (status is NOT NULL: the same test) so that
    -- the planner cannot use the partial index jobs_running_lease_idx here: whenever the last ANALYZE saw
    -- few running rows, the generic plan hash-joined the batch with a full scan of that index, every
    -- running row of every worker (plus its dead entries until the next vacuum) for each finish. Each row
    -- is found by its primary key instead (benchmarks/README.md, "statements.py").
    WHERE j.id = i.id AND coalesce(j.status, '') = 'running' AND j.attempt = i.attempt AND j.claim_epoch = i.epoch
      AND (i.status <> 'cancelled' OR j.cancel_requested_at IS NOT NULL)
    -- j.* here is the row as written: a retry turned into a cancel reads status 'cancelled'
    RETURNING j.id, j.attempt, j.claim_epoch, %(worker_id)s::text AS worker_id, j.status,
              CASE WHEN i.status = 'scheduled' AND j.status = 'cancelled' THEN 'cancelled' ELSE i.outcome END
                  AS outcome,
              CASE WHEN i.status = 'scheduled' AND j.status = 'cancelled' THEN j.error_class ELSE i.error_class END
                  AS error_class,
              i.error_message,
              CASE WHEN i.status = 'scheduled' AND j.status = 'cancelled'
                   THEN jsonb_build_object('raised', i.error_class, 'retry_dropped', true)
                   ELSE i.detail END AS detail
), att AS (
    UPDATE taskq.job_attempts AS a SET
        finished_at = now(), outcome = u.outcome, error_class = u.error_class, error_message = u.error_message
    FROM upd AS u
    WHERE a.job_id = u.id AND a.claim_epoch = u.claim_epoch
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, CASE WHEN u.outcome = 'snoozed' THEN 'snoozed' ELSE 'state_change' END,
           'running', u.status, u.attempt, u.worker_id,
           coalesce(u.detail, '{}'::jsonb)
           || jsonb_strip_nulls(jsonb_build_object('error_class', u.error_class, 'claim_epoch', u.claim_epoch))
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_release_batch
-- Shutdown RELEASING: give interrupted rows back to the fleet (pending, or scheduled behind a hold),
-- attempt not refunded, interrupt_count + 1, progress kept. An attempt flagged `unsafe` (a non-idempotent
-- actor the shutdown had to force: its effect is unknown) ends crashed (WorkerShutdown) instead, for an
-- operator to requeue. Two more rows are not released: one that
-- carries an operator's cancel request ends cancelled (CancelledForced: the operator's own verdict,
-- the same fenced write the unwinding consumer races), and one past its schedule_to_close ends failed
-- (DeadlineExceeded). Rows whose fence fails are left alone.
WITH i AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(epochs)s::bigint[], %(unsafe)s::bool[])
        AS t(id, attempt, epoch, unsafe)
), verdict AS (
    SELECT j.id, j.attempt, j.claim_epoch,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN j.schedule_to_close IS NOT NULL AND j.schedule_to_close <= now() THEN 'failed'
                WHEN i.unsafe THEN 'crashed'
                WHEN j.scheduled_at > now() THEN 'scheduled'
                ELSE 'pending' END AS status
    FROM taskq.jobs AS j JOIN i ON i.id = j.id
    -- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
    WHERE coalesce(j.status, '') = 'running' AND j.attempt = i.attempt AND j.claim_epoch = i.epoch
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = v.status,
        interrupt_count = j.interrupt_count + CASE WHEN v.status IN ('pending', 'scheduled') THEN 1 ELSE 0 END,
        worker_id = CASE WHEN v.status IN ('pending', 'scheduled') THEN NULL ELSE j.worker_id END,
        lock_expires_at = NULL,
        cancel_phase = CASE WHEN v.status = 'cancelled' THEN greatest(j.cancel_phase, 2)
                            WHEN v.status = 'failed' THEN j.cancel_phase ELSE 0 END,
        finished_at = CASE WHEN v.status IN ('pending', 'scheduled') THEN NULL ELSE now() END,
        error_class = CASE v.status WHEN 'cancelled' THEN 'CancelledForced'
                                    WHEN 'failed' THEN 'DeadlineExceeded'
                                    WHEN 'crashed' THEN 'WorkerShutdown' ELSE j.error_class END,
        error_message = CASE v.status
                            WHEN 'cancelled' THEN 'cancelled by an operator while the worker was shutting down'
                            WHEN 'failed' THEN 'schedule_to_close passed while the worker was shutting down'
                            WHEN 'crashed' THEN 'the worker shut down and had to force this attempt of a '
                                                'non-idempotent actor: its effect is unknown, so it is not re-run '
                                                '(requeue it once checked)'
                            ELSE j.error_message END
    FROM verdict AS v
    WHERE j.id = v.id AND coalesce(j.status, '') = 'running' AND j.claim_epoch = v.claim_epoch
    RETURNING j.id, j.attempt, j.claim_epoch, v.status
), att AS (
    UPDATE taskq.job_attempts AS a SET finished_at = now(),
        outcome = CASE u.status WHEN 'cancelled' THEN 'cancelled' WHEN 'failed' THEN 'failed'
                                WHEN 'crashed' THEN 'crashed' ELSE 'interrupted' END,
        error_class = CASE u.status WHEN 'cancelled' THEN 'CancelledForced' WHEN 'failed' THEN 'DeadlineExceeded'
                                    ELSE 'WorkerShutdown' END,
        error_message = 'worker shutdown'
    FROM upd AS u
    WHERE a.job_id = u.id AND a.claim_epoch = u.claim_epoch
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, 'state_change', 'running', u.status, u.attempt, %(worker_id)s,
           jsonb_build_object('cause', 'shutdown', 'released', u.status IN ('pending', 'scheduled'),
                              'claim_epoch', u.claim_epoch)
           || CASE WHEN u.status = 'cancelled'
                   THEN jsonb_build_object('error_class', 'CancelledForced', 'cancel_phase', 2)
                   WHEN u.status = 'crashed'
                   THEN jsonb_build_object('error_class', 'WorkerShutdown', 'idempotent', false)
                   ELSE '{}'::jsonb END
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_mark_not_idempotent
-- Before the first run of an `@actor(idempotent=False)` whose row does not say so (it was enqueued by
-- name): record it, fenced, so that any reclaimer (which may not know the actor) ends it crashed rather
-- than retry it. No row: the attempt no longer holds the job and must not run.
UPDATE taskq.jobs SET revision = revision + 1, idempotent = false
WHERE id = %(id)s AND status = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
RETURNING id;

-- name: job_progress
-- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
UPDATE taskq.jobs SET revision = revision + 1, progress = %(progress)s::jsonb
WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
RETURNING id;

-- name: job_cancel_escalate
-- CANCEL_ESCALATION_SQL (spec §3): phase 1 -> 2 on a row we hold, with its event; rowcount 0 = skip.
WITH upd AS (
    UPDATE taskq.jobs SET revision = revision + 1, cancel_phase = 2
    -- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
    WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
      AND cancel_phase = 1
    RETURNING id, attempt
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, 'state_change', 'running', 'running', u.attempt, %(worker_id)s,
           jsonb_build_object('cancel_phase_from', 1, 'cancel_phase_to', 2, 'worker_id', %(worker_id)s::text)
    FROM upd AS u
)
SELECT id FROM upd;

-- name: job_reclaim
-- Reclaim running rows whose worker is gone: with %(worker_id)s NULL, the sweeper's case (every row
-- whose lease ran out: its own lock from the claim and its worker's lease, renewed by the heartbeat,
-- have both passed, so the worker died or froze); with a worker id, the supervisor's (it saw that worker
-- die, so its rows need not wait) or a worker's taking over the rows of an earlier process that used
-- its id. A sweeper reclaims its own worker's rows only when that worker does not track them (below):
-- it is alive, and its heartbeat and self-fence look after the rest. One set of verdicts for all: a cancel was in flight -> cancelled with NULL marker;
-- deadline passed -> failed; budget left -> scheduled after a backoff, unless the job is not idempotent
-- (jobs.idempotent false: its attempt's effect is unknown, so it is not re-run blindly); otherwise crashed. The attempt
-- is never refunded; the attempts row says WorkerCrashed. The jobs_lease_taken trigger tells a worker
-- that is still alive after all (frozen, not dead) which of its rows went.
-- SKIP LOCKED: a row some live transaction holds is left for the next sweep.
-- With %(tracked)s (the ids the sweeper's own worker holds), it also reclaims that worker's rows whose
-- claim lock ran out and that the worker does not track: an outcome it could not write, a claim whose
-- reply was lost. Its lease would otherwise hold them for as long as it lives.
WITH expired AS (
    SELECT j.id FROM taskq.jobs AS j
    WHERE j.status = 'running'
      AND CASE WHEN %(worker_id)s::text IS NOT NULL THEN j.worker_id = %(worker_id)s::text
               WHEN j.worker_id = %(sweeper_id)s::text
               THEN j.lock_expires_at < now() AND j.id <> ALL(%(tracked)s::uuid[])
               ELSE j.lock_expires_at < now()
                    AND NOT EXISTS (SELECT 1 FROM taskq.workers AS w
                                    WHERE w.id = j.worker_id AND w.lease_expires_at >= now()) END
    ORDER BY j.lock_expires_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
), verdict AS (
    SELECT j.id, j.attempt, j.claim_epoch, j.worker_id,
           greatest(j.lock_expires_at, w.lease_expires_at) AS lock_expires_at,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN j.schedule_to_close IS NOT NULL AND j.schedule_to_close <= now() THEN 'failed'
                WHEN j.attempt < j.max_attempts AND j.idempotent THEN 'scheduled'
                ELSE 'crashed' END AS status,
           coalesce(%(detail)s::text, format('stopped renewing its lease (lease expired at %%s)',
                                             greatest(j.lock_expires_at, w.lease_expires_at)))
           || CASE WHEN NOT j.idempotent AND j.attempt < j.max_attempts
                   THEN '; not retried: the actor is not idempotent (requeue it once its effect is checked)'
                   ELSE '' END AS why,
           j.idempotent
    FROM taskq.jobs AS j JOIN expired AS e ON e.id = j.id
    LEFT JOIN taskq.workers AS w ON w.id = j.worker_id
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = v.status,
        worker_id = CASE WHEN v.status = 'scheduled' THEN NULL ELSE j.worker_id END,
        lock_expires_at = NULL,
        cancel_phase = CASE WHEN v.status = 'scheduled' THEN 0 ELSE j.cancel_phase END,
        finished_at = CASE WHEN v.status = 'scheduled' THEN NULL ELSE now() END,
        scheduled_at = CASE WHEN v.status = 'scheduled'
                            THEN now() + least(%(max_delay)s::float8,
                                               %(base_delay)s::float8 * power(2, greatest(j.attempt - 1, 0)))
                                         * interval '1 second'
                            ELSE j.scheduled_at END,
        error_class = CASE v.status WHEN 'cancelled' THEN NULL WHEN 'failed' THEN 'DeadlineExceeded'
                                    ELSE 'WorkerCrashed' END,
        error_message = CASE v.status WHEN 'cancelled' THEN NULL
                                      WHEN 'failed' THEN 'schedule_to_close passed while its worker was gone'
                                      ELSE format('worker %%s %%s', v.worker_id, v.why) END
    FROM verdict AS v
    WHERE j.id = v.id AND j.status = 'running' AND j.attempt = v.attempt AND j.claim_epoch = v.claim_epoch
    RETURNING j.id, v.attempt, v.claim_epoch, v.worker_id, v.status, v.lock_expires_at, v.why, v.idempotent
), att AS (
    UPDATE taskq.job_attempts AS a SET finished_at = now(), outcome = 'crashed', error_class = 'WorkerCrashed',
        error_message = format('%%s: worker %%s %%s', %(cause)s::text, u.worker_id, u.why)
    FROM upd AS u
    WHERE a.job_id = u.id AND a.claim_epoch = u.claim_epoch
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, 'state_change', 'running', u.status, u.attempt, u.worker_id,
           jsonb_strip_nulls(jsonb_build_object(
               'cause', %(cause)s::text, 'lock_expired_at', u.lock_expires_at, 'swept_by', %(sweeper_id)s::text,
               'worker_exit', %(detail)s::text, 'claim_epoch', u.claim_epoch,
               'idempotent', CASE WHEN NOT u.idempotent THEN false END))
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_sweep_deadline
-- Waiting rows (awaiting_parents too) whose schedule_to_close passed before any worker ran them end failed.
WITH late AS (
    SELECT id, status AS prev FROM taskq.jobs
    WHERE status IN ('pending', 'scheduled', 'awaiting_parents') AND schedule_to_close IS NOT NULL AND schedule_to_close <= now()
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE taskq.jobs AS j SET revision = j.revision + 1, status = 'failed', finished_at = now(), error_class = 'DeadlineExceeded',
        error_message = 'schedule_to_close passed before the job could finish'
    FROM late AS l WHERE j.id = l.id
    RETURNING j.id, l.prev, j.attempt
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT u.id, 'state_change', u.prev, 'failed', u.attempt,
           jsonb_build_object('error_class', 'DeadlineExceeded', 'swept_by', %(sweeper_id)s::text)
    FROM upd AS u
)
SELECT id FROM upd;

-- name: listen
LISTEN taskq_jobs; LISTEN taskq_cancel; LISTEN taskq_queues; LISTEN taskq_settle;

-- name: prune_succeeded
-- Retention, one bounded batch of the succeeded class (succeeded and cancelled): the oldest finished rows
-- past the keep window, read in finished_at order from jobs_retention_succeeded_idx and deleted with their
-- events by taskq.delete_terminal_jobs (which deletes nothing that is not terminal). SKIP LOCKED: a row
-- some transaction holds (a requeue, a cancel) is left for the next round, and the lock keeps the row
-- terminal until the delete. The gate, a transaction-level advisory lock tried once per batch (so it
-- works behind transaction poolers) and held through the pause after it (prune_pause), lets one pruner
-- at a time work across the fleet: one that finds the gate taken ends its round (an empty batch) and
-- comes back at its next interval. A parent that a non-terminal child still depends on is passed over
-- (delete_terminal_jobs would keep it too, but the batch would then keep choosing it).
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.jobs, gate
    WHERE gate.open
      AND status IN ('succeeded', 'cancelled') AND finished_at < now() - %(keep)s::float8 * interval '1 second'
      AND NOT (has_dependents AND EXISTS (SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c
                                          ON c.id = d.child_id WHERE d.parent_id = jobs.id
                                          AND c.status IN ('pending', 'scheduled', 'running', 'awaiting_parents')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE OF jobs SKIP LOCKED
)
SELECT d.jobs, d.events FROM taskq.delete_terminal_jobs(ARRAY(SELECT id FROM doomed)) AS d;

-- name: prune_failed
-- As prune_succeeded, for the failed class (failed, crashed, abandoned), from jobs_retention_failed_idx.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.jobs, gate
    WHERE gate.open AND status IN ('failed', 'crashed', 'abandoned')
      AND finished_at < now() - %(keep)s::float8 * interval '1 second'
      AND NOT (has_dependents AND EXISTS (SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c
                                          ON c.id = d.child_id WHERE d.parent_id = jobs.id
                                          AND c.status IN ('pending', 'scheduled', 'running', 'awaiting_parents')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE OF jobs SKIP LOCKED
)
SELECT d.jobs, d.events FROM taskq.delete_terminal_jobs(ARRAY(SELECT id FROM doomed)) AS d;

-- name: prune_attempts
-- One bounded batch of finished attempts rows past their own keep window (job_attempts_retention_idx).
-- They outlive their jobs; an open attempt (finished_at NULL) is never pruned. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT job_id, claim_epoch FROM taskq.job_attempts, gate
    WHERE gate.open AND finished_at IS NOT NULL AND finished_at < now() - %(keep)s::float8 * interval '1 second'
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE OF job_attempts SKIP LOCKED
)
SELECT d.attempts, 0::bigint AS events
FROM taskq.delete_finished_attempts(ARRAY(SELECT job_id FROM doomed), ARRAY(SELECT claim_epoch FROM doomed)) AS d;

-- name: prune_receipts
-- One bounded batch of the web API's idempotency receipts past their keep window (`retention_receipts`),
-- oldest first from operator_requests_created_idx, deleted by the owner function (the worker role has no
-- DELETE on the table). No row lock (the worker role may not take one here, and needs none): a receipt
-- that a new request takes over past the 24 h window (receipt_claim) gets created_at = now(), and the
-- function's delete, waiting on that row, re-checks its age and leaves it. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT principal, key FROM taskq.operator_requests, gate
    WHERE gate.open AND created_at < now() - %(keep)s::float8 * interval '1 second'
    ORDER BY created_at
    LIMIT %(limit)s
)
SELECT taskq.delete_operator_requests(ARRAY(SELECT principal FROM doomed), ARRAY(SELECT key FROM doomed),
                                      %(keep)s::float8) AS rows, 0::bigint AS events;

-- name: prune_audit
-- One bounded batch of operator audit rows past their keep window (`retention_audit`), oldest first from
-- operator_audit_at_idx, deleted by the owner function. A window under an hour counts as an hour (the
-- function's floor too). Audit rows are never updated: no row lock. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.operator_audit, gate
    WHERE gate.open AND at < now() - greatest(%(keep)s::float8, 3600) * interval '1 second'
    ORDER BY at
    LIMIT %(limit)s
)
SELECT taskq.delete_operator_audit(ARRAY(SELECT id FROM doomed), %(keep)s::float8) AS rows, 0::bigint AS events;

-- name: prune_pause
-- The pause after a prune batch, taken holding the batch gate: while one pruner pauses, a batch of any
-- other pruner finds the gate taken and ends its round, so the fleet as a whole prunes at one pruner's
-- pace however many workers run one. A pruner that finds the gate taken here returns at once (its next
-- batch will find it taken too). A transaction of its own that holds no row lock.
SELECT pg_sleep(%(seconds)s::float8) FROM (SELECT pg_try_advisory_xact_lock(7461732, 1) AS got) AS g WHERE g.got;

-- name: prune_count
-- `taskq prune --dry-run`: what a prune would delete now, per class, without deleting (a window of 0
-- disables its class). The same index-backed predicates as the batches.
WITH succ AS (
    SELECT id FROM taskq.jobs
    WHERE %(keep_succeeded)s::float8 > 0 AND status IN ('succeeded', 'cancelled')
      AND finished_at < now() - %(keep_succeeded)s::float8 * interval '1 second'
), fail AS (
    SELECT id FROM taskq.jobs
    WHERE %(keep_failed)s::float8 > 0 AND status IN ('failed', 'crashed', 'abandoned')
      AND finished_at < now() - %(keep_failed)s::float8 * interval '1 second'
)
SELECT (SELECT count(*) FROM succ) AS succeeded,
       (SELECT count(*) FROM fail) AS failed,
       (SELECT count(*) FROM taskq.job_attempts
        WHERE %(keep_attempts)s::float8 > 0 AND finished_at IS NOT NULL
          AND finished_at < now() - %(keep_attempts)s::float8 * interval '1 second') AS attempts,
       (SELECT count(*) FROM taskq.operator_requests
        WHERE %(keep_receipts)s::float8 > 0
          AND created_at < now() - %(keep_receipts)s::float8 * interval '1 second') AS receipts,
       (SELECT count(*) FROM taskq.operator_audit
        WHERE %(keep_audit)s::float8 > 0
          AND at < now() - greatest(%(keep_audit)s::float8, 3600) * interval '1 second') AS audit,
       (SELECT count(*) FROM taskq.job_events AS e
        WHERE e.job_id IN (SELECT id FROM succ UNION ALL SELECT id FROM fail)) AS events;

-- ---- schedules (taskq.backend.schedules) ------------------------------------------------------

-- name: schedule_known
-- At start, before the upsert: the database's clock (next slots are computed from it, never from this
-- host's) and the stored definitions of the schedules this worker declares or its owner had.
SELECT now() AS now, s.name, s.definition, s.enabled
FROM (SELECT 1) AS one
LEFT JOIN taskq.schedules AS s ON s.name = ANY(%(names)s::text[]) OR s.owner = %(owner)s;

-- name: schedule_upsert
-- One code declaration. A changed definition (cron, interval, time zone) moves the next slot; any
-- other change keeps it. An unchanged declaration writes nothing. Operator state (pause) is kept.
INSERT INTO taskq.schedules AS s (name, actor, queue, payload, priority, tags, max_attempts, cron, every_seconds,
                                  timezone, definition, misfire, max_catch_up, misfire_grace, overlap,
                                  next_run_at, owner)
VALUES (%(name)s, %(actor)s, %(queue)s, %(payload)s::jsonb, %(priority)s, %(tags)s::text[], %(max_attempts)s,
        %(cron)s, %(every_seconds)s, %(timezone)s, %(definition)s, %(misfire)s, %(max_catch_up)s,
        %(misfire_grace)s, %(overlap)s, %(next_run_at)s, %(owner)s)
ON CONFLICT (name) DO UPDATE SET
    actor = excluded.actor, queue = excluded.queue, payload = excluded.payload, priority = excluded.priority,
    tags = excluded.tags, max_attempts = excluded.max_attempts, cron = excluded.cron,
    every_seconds = excluded.every_seconds, timezone = excluded.timezone, misfire = excluded.misfire,
    max_catch_up = excluded.max_catch_up, misfire_grace = excluded.misfire_grace, overlap = excluded.overlap,
    next_run_at = CASE WHEN s.definition = excluded.definition THEN s.next_run_at ELSE excluded.next_run_at END,
    definition = excluded.definition, owner = excluded.owner, enabled = true, updated_at = now(),
    resumed_at = CASE WHEN s.enabled THEN s.resumed_at ELSE now() END
WHERE (s.actor, s.queue, s.payload, s.priority, s.tags, s.max_attempts, s.definition, s.misfire,
       s.max_catch_up, s.misfire_grace, s.overlap, s.owner, s.enabled)
      IS DISTINCT FROM
      (excluded.actor, excluded.queue, excluded.payload, excluded.priority, excluded.tags, excluded.max_attempts,
       excluded.definition, excluded.misfire, excluded.max_catch_up, excluded.misfire_grace, excluded.overlap,
       excluded.owner, true);

-- name: schedule_disable_gone
-- The owner's code schedules this worker no longer declares: disabled (never deleted: their history and
-- operator state stay, and declaring them again enables them).
UPDATE taskq.schedules SET enabled = false, updated_at = now()
WHERE owner = %(owner)s AND enabled AND NOT (name = ANY(%(names)s::text[]))
RETURNING name;

-- name: schedule_due
-- A tick's read, in the tick's transaction: lock the due schedules (another scheduler skips them) and
-- tell the database's clock, the next slot of the others (to know when to wake) and whether any
-- schedule is enabled at all. Always one row at least (NULL schedule columns when nothing is due).
WITH due AS (
    SELECT name, cron, every_seconds, timezone, misfire, max_catch_up, misfire_grace, overlap, next_run_at,
           resumed_at, queue, actor
    FROM taskq.schedules
    WHERE enabled AND paused_at IS NULL AND next_run_at <= now()
    ORDER BY next_run_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
SELECT now() AS now,
       (SELECT min(next_run_at) FROM taskq.schedules
        WHERE enabled AND paused_at IS NULL AND next_run_at > now()) AS upcoming,
       EXISTS (SELECT 1 FROM taskq.schedules WHERE enabled) AS any_enabled,
       due.name, due.cron, due.every_seconds, due.timezone, due.misfire, due.max_catch_up, due.misfire_grace,
       due.overlap, due.next_run_at, due.resumed_at, due.queue, due.actor
FROM (SELECT 1) AS one
LEFT JOIN due ON true;

-- name: schedule_fire
-- A tick's write, in the same transaction, for every schedule it locked: insert the slot jobs (one per
-- slot; the slot's retained unique key keeps a slot whose job is still stored from getting a second,
-- ON CONFLICT turns that into nothing inserted), skip them while the
-- previous job of an overlap='skip' schedule is pending or running, and move next_run_at forward (never
-- back). One NOTIFY per queue that got jobs.
WITH plan AS (
    SELECT * FROM unnest(%(names)s::text[], %(next_run_ats)s::timestamptz[], %(missed)s::bigint[])
        AS p(name, next_run_at, missed)
), slot AS (
    SELECT * FROM unnest(%(slot_names)s::text[], %(slot_times)s::timestamptz[], %(slot_ids)s::uuid[],
                         %(slot_traces)s::jsonb[])
        AS t(name, scheduled_for, id, trace_context)
), ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at,
                            schedule, scheduled_for, unique_key, unique_scope, trace_context)
    SELECT t.id, s.actor, s.queue, s.payload, 'pending', s.priority, s.tags, s.max_attempts, now(),
           s.name, t.scheduled_for,
           'schedule:' || s.name || ':' || to_char(t.scheduled_for AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
           'retained', t.trace_context
    FROM slot AS t JOIN taskq.schedules AS s ON s.name = t.name
    WHERE s.overlap = 'allow' OR s.last_job_id IS NULL OR NOT EXISTS (
        SELECT 1 FROM taskq.jobs AS j
        WHERE j.id = s.last_job_id AND j.status IN ('pending', 'scheduled', 'running'))
    ON CONFLICT DO NOTHING
    RETURNING id, schedule, scheduled_for, queue
), latest AS (
    SELECT DISTINCT ON (schedule) schedule, id, scheduled_for FROM ins ORDER BY schedule, scheduled_for DESC
), upd AS (
    UPDATE taskq.schedules AS s SET
        next_run_at = greatest(s.next_run_at, p.next_run_at),
        last_run_at = coalesce(l.scheduled_for, s.last_run_at),
        last_job_id = coalesce(l.id, s.last_job_id),
        last_outcome = CASE WHEN l.id IS NOT NULL THEN 'enqueued'
                            WHEN EXISTS (SELECT 1 FROM slot AS t WHERE t.name = p.name) THEN 'skipped_overlap'
                            WHEN p.missed > 0 THEN 'missed'
                            ELSE s.last_outcome END,
        missed_total = s.missed_total + p.missed,
        updated_at = now()
    FROM plan AS p LEFT JOIN latest AS l ON l.schedule = p.name
    WHERE s.name = p.name
    RETURNING s.name
)
SELECT (SELECT count(*) FROM ins) AS inserted,
       (SELECT count(*) FROM upd) AS updated,
       (SELECT count(pg_notify('taskq_jobs', d.queue)) FROM (SELECT DISTINCT queue FROM ins) AS d) AS notified;

-- name: dependency_settle_backlog
-- The resolver's step: up to `slices` slices of the dependency backlog that no other step holds, each at
-- most one chunk (taskq.settle_chunk()) of a parent's unresolved edges, settled in this transaction and
-- deleted (taskq.settle_backlog, migration 11). Returns the slices taken.
SELECT taskq.settle_backlog(%(slices)s);
