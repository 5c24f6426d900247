-- Durable jobs (sql/0017_durable_jobs.sql): steps, sleeps, waits for a signal, signals.

-- name: steps_load
-- What earlier attempts of a job stored (its steps, sleeps and waits), with the database's clock: a sleep
-- or a wait is over when its wake_at has passed by that clock, whatever the worker's says.
SELECT kind, name, result, wake_at, wake_at IS NOT NULL AND wake_at <= now() AS due, attempt, created_at
FROM taskq.job_steps WHERE job_id = %(job_id)s;

-- name: step_save
-- Store one step's result (or a sleep's or a wait's wake-up) for the attempt that holds the job. The
-- job's row is locked FOR SHARE with the fence checked, so the write commits only while this attempt still
-- holds the job: a reclaim, a cancel, a finish that commits first makes the fence fail (held = 0, nothing
-- stored); one that comes later waits for this commit. A name already stored (by an earlier attempt of
-- the same run of code) is left as it is. A step gets an event on the job's timeline.
WITH j AS (
    SELECT id FROM taskq.jobs
    WHERE id = %(job_id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s
      AND claim_epoch = %(claim_epoch)s AND worker_id = %(worker_id)s
    FOR SHARE
), ins AS (
    INSERT INTO taskq.job_steps (job_id, kind, name, attempt, claim_epoch, result, wake_at)
    SELECT j.id, %(kind)s, %(name)s, %(attempt)s, %(claim_epoch)s, %(result)s::jsonb,
           CASE WHEN %(wake_at)s::timestamptz IS NOT NULL THEN %(wake_at)s::timestamptz
                WHEN %(delay)s::float8 IS NULL THEN NULL
                WHEN %(delay)s::float8 = 'Infinity' THEN '9999-12-31 00:00:00+00'::timestamptz
                ELSE now() + %(delay)s::float8 * interval '1 second' END
    FROM j
    ON CONFLICT (job_id, kind, name) DO NOTHING
    RETURNING job_id, kind, name, wake_at
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, attempt, worker_id, detail)
    SELECT i.job_id, 'step', %(attempt)s, %(worker_id)s,
           jsonb_build_object('step', i.name, 'claim_epoch', %(claim_epoch)s::bigint)
    FROM ins AS i WHERE i.kind = 'step'
)
SELECT (SELECT count(*) FROM j) AS held,
       (SELECT i.wake_at FROM ins AS i) AS wake_at,
       (SELECT i.wake_at <= now() FROM ins AS i) AS due;

-- name: signal_take
-- The n-th wait of a run for signal `name` (wait = '<name>#<n>'): take the oldest signal of that name not
-- yet taken, for the attempt that holds the job (fenced as step_save), and remember it as the wait's
-- result, so that a later attempt's same wait returns the same payload (the row then names the attempt that
-- took it, at that time). No signal: nothing changes.
WITH j AS (
    SELECT id FROM taskq.jobs
    WHERE id = %(job_id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s
      AND claim_epoch = %(claim_epoch)s AND worker_id = %(worker_id)s
    FOR SHARE
), s AS (
    SELECT sg.id FROM taskq.job_signals AS sg JOIN j ON sg.job_id = j.id
    WHERE sg.name = %(name)s AND sg.consumed_at IS NULL
    ORDER BY sg.id LIMIT 1
    FOR UPDATE OF sg
), took AS (
    UPDATE taskq.job_signals AS sg SET
        consumed_at = now(), consumed_attempt = %(attempt)s, consumed_epoch = %(claim_epoch)s,
        consumed_by = %(wait)s
    FROM s WHERE sg.id = s.id
    RETURNING sg.id, sg.payload, sg.sent_at
), st AS (
    INSERT INTO taskq.job_steps AS t (job_id, kind, name, attempt, claim_epoch, result)
    SELECT %(job_id)s, 'signal', %(wait)s, %(attempt)s, %(claim_epoch)s,
           jsonb_build_object('payload', k.payload, 'signal_id', k.id)
    FROM took AS k
    ON CONFLICT (job_id, kind, name) DO UPDATE
        SET result = EXCLUDED.result, attempt = EXCLUDED.attempt, claim_epoch = EXCLUDED.claim_epoch,
            created_at = now()
)
SELECT (SELECT count(*) FROM j) AS held, k.id AS signal_id, k.payload
FROM (SELECT 1) AS one LEFT JOIN took AS k ON true;

-- name: signal_timeout
-- The wait's timeout passed with no signal: remember it ({"timeout": true}), so that every later run of
-- the same wait raises SignalTimeout too (fenced as step_save).
WITH j AS (
    SELECT id FROM taskq.jobs
    WHERE id = %(job_id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s
      AND claim_epoch = %(claim_epoch)s AND worker_id = %(worker_id)s
    FOR SHARE
), st AS (
    UPDATE taskq.job_steps AS t SET result = '{"timeout": true}'::jsonb, attempt = %(attempt)s,
        claim_epoch = %(claim_epoch)s, created_at = now()
    FROM j WHERE t.job_id = j.id AND t.kind = 'signal' AND t.name = %(wait)s AND t.result IS NULL
)
SELECT count(*) AS held FROM j;

-- name: signal_send
-- Send signal `name` to a job: kept in order until a wait of the job takes it. A job that waits for that
-- name now becomes due at once (and its queue's workers are woken). The job's row is locked first, so the
-- status read is the one the signal lands on: a terminal job gets no signal (status tells the caller why),
-- and a finish that suspends the job either commits before (and this wakes it) or after (and sees the
-- signal: taskq.signal_ready_v17, re-checked because this writes the running job's row). No row: the job
-- does not exist.
WITH j AS (
    SELECT id, status, queue, wait_kind, wait_signal FROM taskq.jobs WHERE id = %(job_id)s
    FOR NO KEY UPDATE
), ins AS (
    INSERT INTO taskq.job_signals (job_id, name, payload, sent_by)
    SELECT j.id, %(name)s, %(payload)s::jsonb, %(sent_by)s FROM j
    WHERE j.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
    RETURNING id, job_id
), touched AS (
    -- a job waiting for this name wakes; a running one's row is written too (revision only): the finish of
    -- an attempt that suspends it may be waiting for this row lock, having decided that no signal was there
    -- (signal_ready_v17, computed before the wait), and PostgreSQL re-checks that decision once the lock is
    -- released only if the row was updated, not merely locked
    UPDATE taskq.jobs AS x SET revision = x.revision + 1,
        scheduled_at = CASE WHEN j.status = 'scheduled' THEN least(x.scheduled_at, now()) ELSE x.scheduled_at END
    FROM j JOIN ins ON ins.job_id = j.id
    WHERE x.id = j.id
      AND (j.status = 'running' OR (j.status = 'scheduled' AND j.wait_kind = 'signal' AND j.wait_signal = %(name)s))
    RETURNING x.id, x.queue, j.status = 'scheduled' AS woke
), woke AS (
    SELECT t.id, t.queue FROM touched AS t WHERE t.woke
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, detail)
    SELECT ins.job_id, 'signal',
           jsonb_build_object('signal', %(name)s::text, 'signal_id', ins.id, 'woke', EXISTS (SELECT 1 FROM woke))
           || jsonb_strip_nulls(jsonb_build_object('sent_by', %(sent_by)s::text))
    FROM ins
), n AS (
    SELECT pg_notify('taskq_jobs', w.queue) FROM woke AS w
)
SELECT j.status, (SELECT i.id FROM ins AS i) AS signal_id, EXISTS (SELECT 1 FROM woke) AS woke,
       (SELECT count(*) FROM n) AS _n
FROM j;

-- name: job_steps_list
-- A job's steps, sleeps and waits, in the order they were first stored (taskq job, the API, the dashboard).
SELECT kind, name, attempt, claim_epoch, result, wake_at, created_at
FROM taskq.job_steps WHERE job_id = %(job_id)s
ORDER BY created_at, kind, name;

-- name: job_signals_list
-- A job's signals, in the order they were sent.
SELECT id, name, payload, sent_at, sent_by, consumed_at, consumed_attempt, consumed_by
FROM taskq.job_signals WHERE job_id = %(job_id)s
ORDER BY id;

-- name: job_steps_reset
-- Forget what these jobs' earlier attempts stored (requeue with reset_steps=True): their next run starts
-- over. Signals stay: the ones not yet taken wait for the next run.
DELETE FROM taskq.job_steps WHERE job_id = ANY(%(ids)s::uuid[]);

-- name: job_tx_fence
-- The end of a `ctx.transaction()` block, inside the actor's transaction: lock the job's row if this attempt
-- still holds it, so that nothing can take it before the job's success commits in the same transaction. No
-- row: the attempt lost the job, and the transaction rolls back.
SELECT 1 FROM taskq.jobs
WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(claim_epoch)s
  AND worker_id = %(worker_id)s
FOR NO KEY UPDATE;
