-- Queries used by the supervisor (taskq.supervisor.store). Parameters are psycopg %(name)s.

-- name: job_reclaim_dead_worker
-- The supervisor saw this worker die (waitpid), or killed it for going silent: reclaim every row it
-- still holds now instead of waiting for lock expiry. Same verdicts and fences as job_sweep_expired:
-- a cancel was in flight -> cancelled with NULL marker; deadline passed -> failed; budget left ->
-- scheduled after a backoff; otherwise crashed; the attempt row says WorkerCrashed and the attempt is
-- never refunded. The dead worker's registry row goes too. The rows are locked without SKIP LOCKED:
-- the dead worker's own transaction (if it died inside one) is rolled back by the server as soon as
-- its socket closes, and the caller bounds the wait with lock_timeout.
WITH held AS (
    SELECT id FROM taskq.jobs
    WHERE status = 'running' AND worker_id = %(worker_id)s
    ORDER BY id
    FOR UPDATE
), verdict AS (
    SELECT j.id, j.attempt, j.claim_epoch, j.worker_id, j.lock_expires_at,
           CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN j.schedule_to_close IS NOT NULL AND j.schedule_to_close <= now() THEN 'failed'
                WHEN j.attempt < j.max_attempts THEN 'scheduled'
                ELSE 'crashed' END AS status
    FROM taskq.jobs AS j JOIN held AS h ON h.id = j.id
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
                                      ELSE format('worker %%s %%s', v.worker_id, %(detail)s::text) END
    FROM verdict AS v
    WHERE j.id = v.id AND j.status = 'running' AND j.worker_id = %(worker_id)s
      AND j.attempt = v.attempt AND j.claim_epoch = v.claim_epoch
    RETURNING j.id, v.attempt, v.claim_epoch, v.worker_id, v.status, v.lock_expires_at
), att AS (
    UPDATE taskq.job_attempts AS a SET finished_at = now(), outcome = 'crashed', error_class = 'WorkerCrashed',
        error_message = format('%%s: worker %%s %%s', %(cause)s::text, u.worker_id, %(detail)s::text)
    FROM upd AS u
    WHERE a.job_id = u.id AND a.claim_epoch = u.claim_epoch
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, 'state_change', 'running', u.status, u.attempt, u.worker_id,
           jsonb_build_object('cause', %(cause)s::text, 'worker_exit', %(detail)s::text,
                              'lock_expires_at', u.lock_expires_at, 'reclaimed_by', %(reclaimer_id)s::text,
                              'claim_epoch', u.claim_epoch)
    FROM upd AS u
), gone AS (
    DELETE FROM taskq.workers WHERE id = %(worker_id)s
)
SELECT u.id, u.status FROM upd AS u;

-- name: supervisor_tx_timeouts
-- Bound every wait of the current transaction (the supervisor's loop must not hang on the database).
SELECT set_config('statement_timeout', %(ms)s::text, true), set_config('lock_timeout', %(ms)s::text, true);

-- name: supervisor_ping
SELECT 1;
