-- The worker registry and leases (taskq.backend.workers): register, heartbeat, reclaim of expired or
-- dead workers' rows (the sweeper and the supervisor), and the LISTEN of the worker's listener. Parameters are psycopg %(name)s.

-- name: worker_register
-- Also used by a heartbeat that found our row gone (a sweeper took us for dead): it comes back with
-- a fresh lease.
-- Its queues get their taskq.queues rows (first use) in the same statement.
WITH q AS (
    INSERT INTO taskq.queues (name) SELECT DISTINCT unnest(%(queues)s::text[]) ORDER BY 1
    ON CONFLICT (name) DO NOTHING
)
-- The capacities (jobs of each isolation class the worker runs at once; `concurrency` is the async one) and
-- the class of each of its actors are what inv_class_capacity checks its attempts against.
INSERT INTO taskq.workers (id, host, pid, queues, concurrency, lease_expires_at, capacity_async, capacity_thread,
                           capacity_process, actor_isolation)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s, %(concurrency)s,
        now() + %(lock_timeout)s::float8 * interval '1 second', %(capacity_async)s, %(capacity_thread)s,
        %(capacity_process)s, %(actor_isolation)s)
ON CONFLICT (id) DO UPDATE SET last_heartbeat_at = now(), stopping = false,
    lease_expires_at = excluded.lease_expires_at, capacity_async = excluded.capacity_async,
    capacity_thread = excluded.capacity_thread, capacity_process = excluded.capacity_process,
    actor_isolation = excluded.actor_isolation;

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

-- name: heartbeat
-- POLL_CANCEL_FLAGS_SQL, one round trip per tick whatever the number of jobs held: renew this worker's
-- lease (which holds every row it claimed), hand over the rows taken away from it since the last tick
-- (lease_losses), and return the cancel flags of the held rows that have a cancel request. Nothing here
-- visits a held row without a cancel request. kind: 'worker' (one row: is our workers row still there),
-- 'lost' (id, epoch), 'cancel' (id, epoch, cancel_phase).
WITH w AS (
    UPDATE taskq.workers SET last_heartbeat_at = now(),
        lease_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second',
        clock_offset = extract(epoch FROM %(sent_at)s::timestamptz - clock_timestamp())
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
-- LOCK ORDER (runtime/backend/workers.py): `locked` takes the rows in id order, whatever join the planner
-- picks for the UPDATE; by primary key alone, as job_finish_batch does (joined with the batch, the planner
-- scanned jobs from about 200 rows); the UPDATE fences each on its claim.
WITH h AS (
    SELECT * FROM unnest(%(ids)b::uuid[], %(epochs)b::bigint[]) AS h(id, epoch)
), locked AS (
    SELECT j.id FROM taskq.jobs AS j
    WHERE j.id = ANY(%(ids)b::uuid[]) AND coalesce(j.status, '') = 'running' AND j.worker_id = %(worker_id)s
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
)
UPDATE taskq.jobs AS j SET revision = j.revision + 1, lock_expires_at = now() + %(lock_timeout)s::float8 * interval '1 second'
FROM h JOIN locked AS l ON l.id = h.id
WHERE j.id = h.id AND j.claim_epoch = h.epoch AND j.status = 'running' AND j.worker_id = %(worker_id)s
RETURNING j.id, j.claim_epoch, j.cancel_phase;

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
        wait_kind = NULL, wait_signal = NULL,
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

-- name: listener_probe
-- The LISTEN connection's check of itself, every few seconds (taskq.worker.listener): is the server still
-- a primary (a standby delivers no NOTIFY of the primary's commits), and is this session still listening
-- on every channel.
SELECT pg_is_in_recovery() AS in_recovery, ARRAY(SELECT pg_listening_channels()) AS channels;
