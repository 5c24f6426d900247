-- Queries used by the worker runtime (taskq.worker.store). Parameters are psycopg %(name)s.
-- Every write to a claimed row is fenced on (id, status='running', attempt, claim_epoch).

-- name: worker_register
-- Also used by a heartbeat that found our row gone (a sweeper took us for dead): it comes back with
-- a fresh lease.
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
WITH picked AS (
    SELECT c.id, c.prev
    FROM (SELECT DISTINCT unnest(%(queues)s::text[]) LIMIT cardinality(%(queues)s::text[])) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, status AS prev, priority, scheduled_at FROM taskq.jobs
        WHERE status IN ('pending', 'scheduled') AND queue = q.name AND scheduled_at <= now()
        ORDER BY priority, scheduled_at, id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    ORDER BY c.priority, c.scheduled_at, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE taskq.jobs AS j SET
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
              j.schedule_to_close, j.priority, p.prev
), att AS (
    INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id)
    SELECT c.id, c.attempt, c.claim_epoch, %(worker_id)s FROM claimed AS c
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT c.id, 'state_change', c.prev, 'running', c.attempt, %(worker_id)s,
           jsonb_build_object('claim_epoch', c.claim_epoch)
    FROM claimed AS c
)
SELECT id, actor, queue, payload, attempt, max_attempts, claim_epoch, progress, schedule_to_close
FROM claimed
ORDER BY priority, id;

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
UPDATE taskq.jobs AS j SET lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second'
FROM unnest(%(ids)b::uuid[], %(epochs)b::bigint[]) AS h(id, epoch)
WHERE j.id = h.id AND j.claim_epoch = h.epoch AND j.status = 'running' AND j.worker_id = %(worker_id)s
RETURNING j.id, j.claim_epoch, j.cancel_phase;

-- name: job_finish_batch
-- Every outcome of an attempt, batched: succeeded / failed / cancelled / abandoned / crashed, or
-- 'scheduled' for a retry after retry_delay seconds. Rows whose fence fails are left alone; the
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
                         %(retry_delays)b::float8[], %(outcomes)b::text[], %(details)b::jsonb[])
        AS t(id, attempt, epoch, status, result, error_class, error_message, retry_delay, outcome, detail)
), upd AS (
    -- the cancel request is read from the locked row (not from the statement's snapshot), so a request
    -- that commits while this statement waits for the row lock is honoured too
    UPDATE taskq.jobs AS j SET
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
                            WHEN i.error_class = 'CancelledForced' THEN 2 ELSE j.cancel_phase END
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
    SELECT u.id, 'state_change', 'running', u.status, u.attempt, u.worker_id,
           coalesce(u.detail, '{}'::jsonb)
           || jsonb_strip_nulls(jsonb_build_object('error_class', u.error_class, 'claim_epoch', u.claim_epoch))
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_release_batch
-- Shutdown RELEASING: give interrupted rows back to the fleet (pending, or scheduled behind a hold),
-- attempt not refunded, interrupt_count + 1, progress kept. Two rows are not released: one that
-- carries an operator's cancel request ends cancelled (CancelledForced: the operator's own verdict,
-- the same fenced write the unwinding consumer races), and one past its schedule_to_close ends failed
-- (DeadlineExceeded). Rows whose fence fails are left alone.
WITH i AS (
    SELECT * FROM unnest(%(ids)s::uuid[], %(attempts)s::int[], %(epochs)s::bigint[]) AS t(id, attempt, epoch)
), verdict AS (
    SELECT j.id, j.attempt, j.claim_epoch,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN j.schedule_to_close IS NOT NULL AND j.schedule_to_close <= now() THEN 'failed'
                WHEN j.scheduled_at > now() THEN 'scheduled'
                ELSE 'pending' END AS status
    FROM taskq.jobs AS j JOIN i ON i.id = j.id
    -- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
    WHERE coalesce(j.status, '') = 'running' AND j.attempt = i.attempt AND j.claim_epoch = i.epoch
), upd AS (
    UPDATE taskq.jobs AS j SET
        status = v.status,
        interrupt_count = j.interrupt_count + CASE WHEN v.status IN ('pending', 'scheduled') THEN 1 ELSE 0 END,
        worker_id = CASE WHEN v.status IN ('pending', 'scheduled') THEN NULL ELSE j.worker_id END,
        lock_expires_at = NULL,
        cancel_phase = CASE WHEN v.status = 'cancelled' THEN greatest(j.cancel_phase, 2)
                            WHEN v.status = 'failed' THEN j.cancel_phase ELSE 0 END,
        finished_at = CASE WHEN v.status IN ('pending', 'scheduled') THEN NULL ELSE now() END,
        error_class = CASE v.status WHEN 'cancelled' THEN 'CancelledForced'
                                    WHEN 'failed' THEN 'DeadlineExceeded' ELSE j.error_class END,
        error_message = CASE v.status
                            WHEN 'cancelled' THEN 'cancelled by an operator while the worker was shutting down'
                            WHEN 'failed' THEN 'schedule_to_close passed while the worker was shutting down'
                            ELSE j.error_message END
    FROM verdict AS v
    WHERE j.id = v.id AND coalesce(j.status, '') = 'running' AND j.claim_epoch = v.claim_epoch
    RETURNING j.id, j.attempt, j.claim_epoch, v.status
), att AS (
    UPDATE taskq.job_attempts AS a SET finished_at = now(),
        outcome = CASE u.status WHEN 'cancelled' THEN 'cancelled' WHEN 'failed' THEN 'failed'
                                ELSE 'interrupted' END,
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
                   ELSE '{}'::jsonb END
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_progress
-- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
UPDATE taskq.jobs SET progress = %(progress)s::jsonb
WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
RETURNING id;

-- name: job_cancel_escalate
-- CANCEL_ESCALATION_SQL (spec §3): phase 1 -> 2 on a row we hold, with its event; rowcount 0 = skip.
WITH upd AS (
    UPDATE taskq.jobs SET cancel_phase = 2
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
-- deadline passed -> failed; budget left -> scheduled after a backoff; otherwise crashed. The attempt
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
                WHEN j.attempt < j.max_attempts THEN 'scheduled'
                ELSE 'crashed' END AS status,
           coalesce(%(detail)s::text, format('stopped renewing its lease (lease expired at %%s)',
                                             greatest(j.lock_expires_at, w.lease_expires_at))) AS why
    FROM taskq.jobs AS j JOIN expired AS e ON e.id = j.id
    LEFT JOIN taskq.workers AS w ON w.id = j.worker_id
), upd AS (
    UPDATE taskq.jobs AS j SET
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
    RETURNING j.id, v.attempt, v.claim_epoch, v.worker_id, v.status, v.lock_expires_at, v.why
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
               'worker_exit', %(detail)s::text, 'claim_epoch', u.claim_epoch))
    FROM upd AS u
)
SELECT u.id, u.status FROM upd AS u;

-- name: job_sweep_deadline
-- Waiting rows whose schedule_to_close passed before any worker ran them end failed.
WITH late AS (
    SELECT id, status AS prev FROM taskq.jobs
    WHERE status IN ('pending', 'scheduled') AND schedule_to_close IS NOT NULL AND schedule_to_close <= now()
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), upd AS (
    UPDATE taskq.jobs AS j SET status = 'failed', finished_at = now(), error_class = 'DeadlineExceeded',
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
LISTEN taskq_jobs; LISTEN taskq_cancel;
