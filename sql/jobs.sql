-- A job's row over its life: enqueue (with unique keys and the NOTIFY), reads, operator cancel and requeue
-- (taskq.backend.core), and the worker's outcome writes (taskq.backend.workers). Every write to a claimed
-- row is fenced on (id, status='running', attempt, claim_epoch, worker_id): the holder is named too, because
-- a failover that loses a committed claim lets the new primary issue the same attempt and claim_epoch again,
-- to another worker (docs/ha.md). Parameters are psycopg %(name)s.

-- name: job_insert
-- Returns only what the server decides; the client knows the rest of the row it sent. A plain
-- INSERT ... RETURNING (the NOTIFY in the RETURNING list) costs the server a sixth less than the same
-- statement wrapped in a CTE. With notify false the NOTIFY is left to a later jobs_notify (backend_notify).
INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                        scheduled_at, schedule_to_close, parent_id, workflow_id, idempotent, trace_context, concurrency_key,
                        fairness_key, fair_tag)
VALUES (%(id)s, %(actor)s::text, %(queue)s::text, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s, %(workflow_id)s::uuid, %(idempotent)s,
        %(trace_context)s::jsonb, %(concurrency_key)s::text, %(fairness_key)s::text,
        CASE WHEN %(fairness_key)s::text IS NOT NULL
                  OR EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = %(queue)s::text)
             THEN (SELECT b.base + b.step
                   FROM taskq.fair_bases_v16(%(queue)s::text, ARRAY[coalesce(%(fairness_key)s::text, '')],
                                             %(priority)s::int, coalesce(%(scheduled_at)s::timestamptz <= now(), true))
                        AS b) END)
RETURNING status, scheduled_at, schedule_to_close, created_at,
          (CASE WHEN %(notify)s::bool AND status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n;

-- name: job_insert_many
-- One statement per batch of one enqueue_many call: only ids and payloads vary, sent as binary arrays
-- (text-format arrays cost microseconds per element to quote); the options are shared scalars. One
-- NOTIFY for the whole batch when its jobs are due now.
WITH fair AS MATERIALIZED (
    -- in a fair queue (or with keys): where each key's jobs of this batch start (sql/0016_fair_claims.sql)
    SELECT b.key AS fkey, b.base, b.step
    FROM taskq.fair_bases_v16(%(queue)s::text,
                              CASE WHEN %(fairness_keys)b::text[] IS NULL THEN ARRAY['']
                                   ELSE ARRAY(SELECT DISTINCT coalesce(k, '') FROM unnest(%(fairness_keys)b::text[]) AS k)
                              END,
                              %(priority)s::int, coalesce(%(scheduled_at)s::timestamptz <= now(), true)) AS b
    WHERE %(fairness_keys)b::text[] IS NOT NULL
       OR EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = %(queue)s::text)
), ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, workflow_id, idempotent, trace_context, concurrency_key,
                            fairness_key, fair_tag)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid, %(workflow_id)s::uuid,
           %(idempotent)s::boolean, %(trace_context)s::jsonb, %(concurrency_key)s::text,
           u.fkey, fair.base + coalesce(u.rank, u.ord) * fair.step
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[], %(fairness_keys)b::text[], %(fairness_ranks)b::int[])
             WITH ORDINALITY AS u(id, payload, fkey, rank, ord)
    LEFT JOIN fair ON fair.fkey = coalesce(u.fkey, '')
    RETURNING status
)
SELECT count(*) AS inserted,
       (CASE WHEN %(notify)s::bool AND bool_or(status = 'pending') THEN pg_notify('taskq_jobs', %(queue)s::text) END)
           IS NULL AS _n
FROM ins;

-- name: job_insert_unique
-- job_insert for a job with a unique key: writes nothing (returns no row) when another job holds the
-- key in jobs_unique_key_idx. The conflict target names that index by its column and predicate.
INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                        scheduled_at, schedule_to_close, parent_id, workflow_id, idempotent, unique_key, unique_scope,
                        trace_context, concurrency_key, fairness_key, fair_tag)
VALUES (%(id)s, %(actor)s::text, %(queue)s::text, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s, %(workflow_id)s::uuid, %(idempotent)s,
        %(unique_key)s, %(unique_scope)s, %(trace_context)s::jsonb, %(concurrency_key)s::text, %(fairness_key)s::text,
        CASE WHEN %(fairness_key)s::text IS NOT NULL
                  OR EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = %(queue)s::text)
             THEN (SELECT b.base + b.step
                   FROM taskq.fair_bases_v16(%(queue)s::text, ARRAY[coalesce(%(fairness_key)s::text, '')],
                                             %(priority)s::int, coalesce(%(scheduled_at)s::timestamptz <= now(), true))
                        AS b) END)
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'))
    DO NOTHING
RETURNING status, scheduled_at, schedule_to_close, created_at,
          (CASE WHEN %(notify)s::bool AND status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n;

-- name: job_unique_holder
-- The job a new row with this key conflicts with (at most one, by jobs_unique_key_idx).
SELECT * FROM taskq.jobs
WHERE unique_key = %(unique_key)s
  AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'));

-- name: job_insert_many_unique
-- job_insert_many with one unique key (or NULL) per job; returns how many rows it wrote, and their ids
-- only when it skipped some (decoding a hundred ids costs the client more than the insert saved).
WITH fair AS MATERIALIZED (
    -- in a fair queue (or with keys): where each key's jobs of this batch start (sql/0016_fair_claims.sql)
    SELECT b.key AS fkey, b.base, b.step
    FROM taskq.fair_bases_v16(%(queue)s::text,
                              CASE WHEN %(fairness_keys)b::text[] IS NULL THEN ARRAY['']
                                   ELSE ARRAY(SELECT DISTINCT coalesce(k, '') FROM unnest(%(fairness_keys)b::text[]) AS k)
                              END,
                              %(priority)s::int, coalesce(%(scheduled_at)s::timestamptz <= now(), true)) AS b
    WHERE %(fairness_keys)b::text[] IS NOT NULL
       OR EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = %(queue)s::text)
), ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, workflow_id, idempotent, unique_key, unique_scope,
                            trace_context, concurrency_key, fairness_key, fair_tag)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid, %(workflow_id)s::uuid,
           %(idempotent)s::boolean, u.key, CASE WHEN u.key IS NOT NULL THEN %(unique_scope)s::text END,
           %(trace_context)s::jsonb, %(concurrency_key)s::text,
           u.fkey, fair.base + coalesce(u.rank, u.ord) * fair.step
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[], %(unique_keys)b::text[], %(fairness_keys)b::text[],
                %(fairness_ranks)b::int[]) WITH ORDINALITY AS u(id, payload, key, fkey, rank, ord)
    LEFT JOIN fair ON fair.fkey = coalesce(u.fkey, '')
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'))
        DO NOTHING
    RETURNING id, status
)
SELECT count(*) AS written,
       CASE WHEN count(*) < cardinality(%(ids)b::uuid[]) THEN array_agg(id) END AS written_ids,
       (CASE WHEN %(notify)s::bool AND bool_or(status = 'pending') THEN pg_notify('taskq_jobs', %(queue)s::text) END)
           IS NULL AS _n
FROM ins;

-- name: job_unique_holders
-- job_unique_holder for many keys: (key, holder id) per key held.
SELECT unique_key, id FROM taskq.jobs
WHERE unique_key = ANY(%(unique_keys)s::text[])
  AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'));

-- name: jobs_notify
-- The NOTIFY an insert left out (see backend_notify): sent after that insert committed.
SELECT pg_notify('taskq_jobs', %(queue)s::text);

-- name: job_get
SELECT * FROM taskq.jobs WHERE id = %(id)s;

-- name: job_workflow_id
-- The workflow of a job (a child enqueued by a running member inherits it).
SELECT workflow_id FROM taskq.jobs WHERE id = %(id)s;

-- name: job_status
SELECT status FROM taskq.jobs WHERE id = %(id)s;

-- name: job_events
SELECT id, job_id, at, kind, from_status, to_status, attempt, worker_id, detail
FROM taskq.job_events WHERE job_id = %(id)s ORDER BY id;

-- name: job_attempts
SELECT job_id, attempt, claim_epoch, worker_id, started_at, finished_at, outcome, error_class, error_message
FROM taskq.job_attempts WHERE job_id = %(id)s ORDER BY claim_epoch;

-- name: job_list
SELECT * FROM taskq.jobs
WHERE (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
  AND (%(actors)s::text[] IS NULL OR actor = ANY(%(actors)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(tags)s::text[] IS NULL OR (tags @> %(tags)s::text[] AND tags <> '{}'::text[]))
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
  AND (%(workflow_id)s::uuid IS NULL OR workflow_id = %(workflow_id)s::uuid)
  AND (%(waiting)s::text IS NULL OR (status = 'scheduled' AND wait_kind IS NOT NULL
                                     AND (%(waiting)s::text = 'any' OR wait_kind = %(waiting)s::text)))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: job_count_by_status
SELECT status, count(*) AS n FROM taskq.jobs GROUP BY status ORDER BY status;

-- name: job_cancel_request
-- One statement: lock the row, then either cancel it before start or flag the running attempt.
WITH target AS (
    SELECT id, status AS prev FROM taskq.jobs WHERE id = %(id)s FOR UPDATE
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = CASE WHEN t.prev = 'running' THEN j.status ELSE 'cancelled' END,
        cancel_phase = CASE WHEN t.prev = 'running' THEN greatest(j.cancel_phase, 1) ELSE j.cancel_phase END,
        cancel_requested_at = now(),
        cancel_reason = %(reason)s,
        error_class = CASE WHEN t.prev = 'running' THEN j.error_class ELSE 'CancelledBeforeStart' END,
        finished_at = CASE WHEN t.prev = 'running' THEN j.finished_at ELSE now() END
    FROM target AS t
    WHERE j.id = t.id
      AND (t.prev IN ('pending', 'scheduled', 'awaiting_parents')
           OR (t.prev = 'running' AND j.cancel_requested_at IS NULL))
    RETURNING j.id, t.prev, j.status, j.attempt, j.claim_epoch, j.worker_id
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, CASE WHEN u.status = 'cancelled' THEN 'state_change' ELSE 'cancel_requested' END,
           u.prev, u.status, u.attempt, u.worker_id,
           jsonb_build_object('reason', %(reason)s::text, 'origin', 'operator')
           || CASE WHEN u.status = 'cancelled'
                   THEN jsonb_build_object('error_class', 'CancelledBeforeStart')
                   ELSE jsonb_build_object('cancel_phase_to', 1) END
    FROM upd AS u
)
SELECT u.prev, u.status,
       (CASE WHEN u.status = 'running'
             THEN pg_notify('taskq_cancel', concat_ws(':', u.id, u.attempt, u.claim_epoch, u.worker_id))
        END) IS NULL AS _n
FROM upd AS u;

-- name: job_cancel_where_batch
-- One bounded batch of a bulk cancel; the caller commits and repeats until it returns no row.
WITH target AS (
    SELECT id, status AS prev FROM taskq.jobs
    WHERE (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
      AND (%(actors)s::text[] IS NULL OR actor = ANY(%(actors)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(tags)s::text[] IS NULL OR (tags @> %(tags)s::text[] AND tags <> '{}'::text[]))
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
      AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
      AND (%(workflow_id)s::uuid IS NULL OR workflow_id = %(workflow_id)s::uuid)
      AND (%(waiting)s::text IS NULL OR (status = 'scheduled' AND wait_kind IS NOT NULL
                                         AND (%(waiting)s::text = 'any' OR wait_kind = %(waiting)s::text)))
      AND (status IN ('pending', 'scheduled', 'awaiting_parents') OR (status = 'running' AND cancel_requested_at IS NULL))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = CASE WHEN t.prev = 'running' THEN j.status ELSE 'cancelled' END,
        cancel_phase = CASE WHEN t.prev = 'running' THEN greatest(j.cancel_phase, 1) ELSE j.cancel_phase END,
        cancel_requested_at = now(),
        cancel_reason = %(reason)s,
        error_class = CASE WHEN t.prev = 'running' THEN j.error_class ELSE 'CancelledBeforeStart' END,
        finished_at = CASE WHEN t.prev = 'running' THEN j.finished_at ELSE now() END
    FROM target AS t
    WHERE j.id = t.id
      AND (j.status IN ('pending', 'scheduled', 'awaiting_parents')
           OR (j.status = 'running' AND j.cancel_requested_at IS NULL))
    RETURNING j.id, t.prev, j.status, j.attempt, j.claim_epoch, j.worker_id
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, CASE WHEN u.status = 'cancelled' THEN 'state_change' ELSE 'cancel_requested' END,
           u.prev, u.status, u.attempt, u.worker_id,
           jsonb_build_object('reason', %(reason)s::text, 'origin', 'operator', 'bulk', true)
           || CASE WHEN u.status = 'cancelled'
                   THEN jsonb_build_object('error_class', 'CancelledBeforeStart')
                   ELSE jsonb_build_object('cancel_phase_to', 1) END
    FROM upd AS u
)
SELECT u.id, u.prev,
       (CASE WHEN u.status = 'running'
             THEN pg_notify('taskq_cancel', concat_ws(':', u.id, u.attempt, u.claim_epoch, u.worker_id))
        END) IS NULL AS _n
FROM upd AS u;

-- name: job_cancel_workflow
-- Cancel every member of a workflow that has not ended (JobsClient.cancel_workflow), in one statement, as
-- job_cancel_request does for one job: the waiting members (pending, scheduled (sleeping and signal-waiting
-- ones too), awaiting_parents) end cancelled (CancelledBeforeStart); the running ones without a cancel
-- request get one (cancel_phase 1, a NOTIFY to their worker, whose ladder goes on from there). The members
-- are locked in id order; one already ended, or ending while this statement waited for its lock, is left
-- alone, as is a running one with a cancel already in flight. Each changed member's event names the
-- workflow (detail.workflow_id) and so does its cancel_reason when none is given. The dependency cascade
-- runs at the statement's end (jobs_settle_dependents) and finds the members already cancelled here.
-- One row per unfinished member (none: `total` alone, with NULLs), each with the workflow's member count.
WITH members AS (
    SELECT id, status AS prev, cancel_requested_at IS NOT NULL AS requested, wait_kind
    FROM taskq.jobs
    WHERE workflow_id = %(workflow_id)s::uuid
      AND status IN ('pending', 'scheduled', 'awaiting_parents', 'running')
    ORDER BY id
    FOR UPDATE
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = CASE WHEN t.prev = 'running' THEN j.status ELSE 'cancelled' END,
        cancel_phase = CASE WHEN t.prev = 'running' THEN greatest(j.cancel_phase, 1) ELSE j.cancel_phase END,
        cancel_requested_at = now(),
        cancel_reason = coalesce(%(reason)s::text, 'workflow-cancel:' || %(workflow_id)s::text),
        error_class = CASE WHEN t.prev = 'running' THEN j.error_class ELSE 'CancelledBeforeStart' END,
        finished_at = CASE WHEN t.prev = 'running' THEN j.finished_at ELSE now() END
    FROM members AS t
    WHERE j.id = t.id AND (t.prev <> 'running' OR NOT t.requested)
    RETURNING j.id, t.prev, j.status, j.attempt, j.claim_epoch, j.worker_id
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, CASE WHEN u.status = 'cancelled' THEN 'state_change' ELSE 'cancel_requested' END,
           u.prev, u.status, u.attempt, u.worker_id,
           jsonb_build_object('reason', %(reason)s::text, 'origin', 'operator',
                              'workflow_id', %(workflow_id)s::text)
           || CASE WHEN u.status = 'cancelled'
                   THEN jsonb_build_object('error_class', 'CancelledBeforeStart')
                   ELSE jsonb_build_object('cancel_phase_to', 1) END
    FROM upd AS u
)
SELECT t.total, m.id, m.prev, m.wait_kind, u.status AS new_status,
       (CASE WHEN u.status = 'running'
             THEN pg_notify('taskq_cancel', concat_ws(':', u.id, u.attempt, u.claim_epoch, u.worker_id))
        END) IS NULL AS _n
FROM (SELECT count(*) AS total FROM taskq.jobs WHERE workflow_id = %(workflow_id)s::uuid) AS t
LEFT JOIN members AS m ON true
LEFT JOIN upd AS u ON u.id = m.id
ORDER BY m.id;

-- name: job_requeue
-- The operator's requeue of one job, in one statement: from failed, crashed or abandoned back to
-- pending, due now, with a fresh budget (max_attempts = attempt + the budget: the actor's max_attempts
-- when the caller knows the actor, else the job's own). attempt and claim_epoch are never lowered, so a
-- zombie of an earlier attempt still fails its fence. Error, worker and cancel fields are cleared (and a
-- deadline already passed, which would fail the rerun at once); progress and job_attempts are kept.
-- (Every terminal write already cleared lock_expires_at, and a failure status has no result: the
-- client role, which runs this, may write neither.)
-- Left unchanged: any other status (requeued false), or a row whose unique key another job holds
-- (conflict names it). A holder committed after this statement's snapshot surfaces as a unique
-- violation, which the caller retries with a fresh snapshot.
WITH target AS (
    SELECT id, status AS prev, actor, queue, unique_key, attempt, claim_epoch, max_attempts, error_class
    FROM taskq.jobs WHERE id = %(id)s
    FOR UPDATE
), holder AS (
    SELECT h.id
    FROM target AS t JOIN taskq.jobs AS h ON h.unique_key = t.unique_key AND h.id <> t.id
    WHERE t.prev IN ('failed', 'crashed', 'abandoned')
      AND (h.unique_scope = 'retained' OR h.status IN ('pending', 'scheduled', 'running'))
    LIMIT 1
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = 'pending',
        scheduled_at = now(),
        max_attempts = least(j.attempt::bigint + coalesce(%(attempts)s::int, b.max_attempts, j.max_attempts),
                             2147483647)::int,
        requeue_count = j.requeue_count + 1,
        started_at = NULL, finished_at = NULL, worker_id = NULL, wait_kind = NULL, wait_signal = NULL,
        cancel_phase = 0, cancel_requested_at = NULL, cancel_reason = NULL,
        error_class = NULL, error_message = NULL,
        schedule_to_close = CASE WHEN j.schedule_to_close <= now() THEN NULL ELSE j.schedule_to_close END
    FROM target AS t
    LEFT JOIN unnest(%(actor_names)s::text[], %(actor_max_attempts)s::int[]) AS b(actor, max_attempts)
           ON b.actor = t.actor
    WHERE j.id = t.id AND t.prev IN ('failed', 'crashed', 'abandoned') AND NOT EXISTS (SELECT 1 FROM holder)
    RETURNING j.id, j.queue, j.attempt, j.claim_epoch, j.max_attempts, j.requeue_count
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT u.id, 'requeued', t.prev, 'pending', u.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'reason', %(reason)s::text, 'origin', 'operator', 'claim_epoch', u.claim_epoch,
               'requeue_count', u.requeue_count, 'max_attempts_from', t.max_attempts,
               'max_attempts_to', u.max_attempts, 'error_class', t.error_class,
               'reset_steps', CASE WHEN %(reset_steps)s::bool THEN true END))
    FROM upd AS u JOIN target AS t ON t.id = u.id
), steps AS (
    -- reset_steps: the rerun starts over (sql/0017_durable_jobs.sql); signals not yet taken stay
    DELETE FROM taskq.job_steps AS s USING upd AS u WHERE %(reset_steps)s::bool AND s.job_id = u.id
)
SELECT t.prev, u.id IS NOT NULL AS requeued, (SELECT id FROM holder) AS conflict_job_id,
       (CASE WHEN u.id IS NOT NULL THEN pg_notify('taskq_jobs', u.queue) END) IS NULL AS _n
FROM target AS t LEFT JOIN upd AS u ON u.id = t.id;

-- name: job_requeue_where_batch
-- One bounded batch of a bulk requeue (job_requeue for every matching failed, crashed or abandoned
-- job with an id above the cursor, in id order); the caller commits and goes on from the last id the
-- batch scanned until a batch scans nothing. Rows whose key is held stay as they are, and are passed
-- over rather than selected again. Two rows of one batch that share a key and have no other holder:
-- the first is requeued and the others conflict with it.
WITH target AS (
    SELECT id, status AS prev, actor, unique_key, max_attempts, error_class
    FROM taskq.jobs
    WHERE (%(ids)s::uuid[] IS NULL OR id = ANY(%(ids)s::uuid[]))
      AND (%(actors)s::text[] IS NULL OR actor = ANY(%(actors)s::text[]))
      AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
      AND (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
      AND (%(tags)s::text[] IS NULL OR (tags @> %(tags)s::text[] AND tags <> '{}'::text[]))
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
      AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
      AND (%(workflow_id)s::uuid IS NULL OR workflow_id = %(workflow_id)s::uuid)
      AND (%(waiting)s::text IS NULL OR (status = 'scheduled' AND wait_kind IS NOT NULL
                                         AND (%(waiting)s::text = 'any' OR wait_kind = %(waiting)s::text)))
      AND status IN ('failed', 'crashed', 'abandoned')
      AND (%(after)s::uuid IS NULL OR id > %(after)s::uuid)
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
), ext AS (
    -- the job that holds the key, if any (a retained row of this same batch can be one: it keeps its
    -- key in every status)
    SELECT t.*,
           (SELECT h.id FROM taskq.jobs AS h
            WHERE t.unique_key IS NOT NULL AND h.unique_key = t.unique_key AND h.id <> t.id
              AND (h.unique_scope = 'retained' OR h.status IN ('pending', 'scheduled', 'running'))
            LIMIT 1) AS holder
    FROM target AS t
), decided AS (
    SELECT e.*,
           coalesce(e.holder, CASE WHEN e.unique_key IS NOT NULL THEN nullif(
               first_value(e.id) OVER (PARTITION BY e.unique_key, e.holder IS NULL ORDER BY e.id), e.id) END)
               AS conflict_job_id
    FROM ext AS e
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = 'pending',
        scheduled_at = now(),
        max_attempts = least(j.attempt::bigint + coalesce(%(attempts)s::int, b.max_attempts, j.max_attempts),
                             2147483647)::int,
        requeue_count = j.requeue_count + 1,
        started_at = NULL, finished_at = NULL, worker_id = NULL, wait_kind = NULL, wait_signal = NULL,
        cancel_phase = 0, cancel_requested_at = NULL, cancel_reason = NULL,
        error_class = NULL, error_message = NULL,
        schedule_to_close = CASE WHEN j.schedule_to_close <= now() THEN NULL ELSE j.schedule_to_close END
    FROM decided AS d
    LEFT JOIN unnest(%(actor_names)s::text[], %(actor_max_attempts)s::int[]) AS b(actor, max_attempts)
           ON b.actor = d.actor
    WHERE j.id = d.id AND d.conflict_job_id IS NULL
    RETURNING j.id, j.queue, j.attempt, j.claim_epoch, j.max_attempts, j.requeue_count
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT u.id, 'requeued', d.prev, 'pending', u.attempt,
           jsonb_strip_nulls(jsonb_build_object(
               'reason', %(reason)s::text, 'origin', 'operator', 'bulk', true, 'claim_epoch', u.claim_epoch,
               'requeue_count', u.requeue_count, 'max_attempts_from', d.max_attempts,
               'max_attempts_to', u.max_attempts, 'error_class', d.error_class,
               'reset_steps', CASE WHEN %(reset_steps)s::bool THEN true END))
    FROM upd AS u JOIN decided AS d ON d.id = u.id
), steps AS (
    DELETE FROM taskq.job_steps AS s USING upd AS u WHERE %(reset_steps)s::bool AND s.job_id = u.id
), notified AS (
    SELECT pg_notify('taskq_jobs', q.queue) FROM (SELECT DISTINCT queue FROM upd) AS q
)
SELECT d.id, d.prev, u.id IS NOT NULL AS requeued, d.conflict_job_id,
       (SELECT count(*) FROM notified) AS _n
FROM decided AS d LEFT JOIN upd AS u ON u.id = d.id
ORDER BY d.id;

-- name: job_finish_batch
-- Every outcome of an attempt, batched: succeeded / failed / cancelled / abandoned / crashed, or
-- 'scheduled' for a retry after retry_delay seconds (outcome 'retried'), or for a snooze (outcome
-- 'snoozed': the actor raised taskq.Snooze; it gives its attempt back to the budget, max_attempts + 1,
-- and its event is of kind 'snoozed'), or for a sleep or a wait for a signal (outcomes 'sleeping' and
-- 'waiting', wait_kind 'sleep' or 'signal': as a snooze, and a retry_delay of Infinity waits without end;
-- sql/0017_durable_jobs.sql). A retry leaves wait_kind NULL. Rows whose fence fails are left alone; the
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
                         %(first_traces)b::jsonb[], %(wait_kinds)b::text[], %(wait_signals)b::text[])
        AS t(id, attempt, epoch, status, result, error_class, error_message, retry_delay, outcome, detail,
             first_trace, wait_kind, wait_signal)
), locked AS (
    -- LOCK ORDER (runtime/backend/workers.py): the rows are locked here, in id order, whatever join the
    -- planner picks for the UPDATE below (a hash join that scans jobs would take them in the table's order,
    -- and deadlock against a bulk cancel); the UPDATE then writes rows this transaction already holds.
    -- The rows are found by their primary key alone (= ANY, no join with the batch): joined, the planner
    -- turned to a scan of jobs and a nested loop over the batch from about 200 rows a batch (EXPLAIN
    -- ANALYZE among 20,000 jobs: 16 / 48 / 79 ms for 200 / 400 / 500 rows; by key 4.6 / 9.1 / 12 ms).
    -- The UPDATE fences each row on its claim.
    SELECT j.id FROM taskq.jobs AS j
    WHERE j.id = ANY(%(ids)b::uuid[]) AND coalesce(j.status, '') = 'running' AND j.worker_id = %(worker_id)s
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
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
        -- a wait for a signal that is already there is due at once (taskq.signal_ready_v17 reads with its
        -- own snapshot; a sender holding this row while this statement waits for it writes the row too, so
        -- the statement re-evaluates this once it has the row, and sees the signal: sql/durable.sql)
        scheduled_at = CASE WHEN i.status <> 'scheduled' OR j.cancel_requested_at IS NOT NULL THEN j.scheduled_at
                            WHEN i.wait_kind = 'signal' AND taskq.signal_ready_v17(j.id, i.wait_signal) THEN now()
                            WHEN i.retry_delay = 'Infinity' THEN '9999-12-31 00:00:00+00'::timestamptz
                            ELSE now() + i.retry_delay * interval '1 second' END,
        wait_kind = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN i.wait_kind END,
        wait_signal = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN i.wait_signal END,
        worker_id = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN NULL
                         ELSE j.worker_id END,
        lock_expires_at = NULL,
        cancel_phase = CASE WHEN i.status = 'scheduled' AND j.cancel_requested_at IS NULL THEN 0
                            WHEN i.error_class = 'CancelledForced' THEN 2 ELSE j.cancel_phase END,
        max_attempts = j.max_attempts
                       + CASE WHEN i.outcome IN ('snoozed', 'sleeping', 'waiting') AND j.cancel_requested_at IS NULL
                              THEN 1 ELSE 0 END,
        snooze_count = j.snooze_count
                       + CASE WHEN i.outcome = 'snoozed' AND j.cancel_requested_at IS NULL THEN 1 ELSE 0 END,
        -- a traced retry: its attempt's span, for the later attempts' links (taskq.contrib.otel)
        trace_context = CASE WHEN i.first_trace IS NULL THEN j.trace_context
                             ELSE coalesce(j.trace_context, '{}'::jsonb) || i.first_trace END
    FROM i JOIN locked AS l ON l.id = i.id
    -- the fence on status is written as coalesce(j.status, '') (status is NOT NULL: the same test) so that
    -- the planner cannot use the partial index jobs_running_lease_idx here: whenever the last ANALYZE saw
    -- few running rows, the generic plan hash-joined the batch with a full scan of that index, every
    -- running row of every worker (plus its dead entries until the next vacuum) for each finish. Each row
    -- is found by its primary key instead (benchmarks/README.md, "statements.py").
    WHERE j.id = i.id AND coalesce(j.status, '') = 'running' AND j.attempt = i.attempt AND j.claim_epoch = i.epoch
      AND j.worker_id = %(worker_id)s
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
    SELECT u.id, CASE WHEN u.outcome IN ('snoozed', 'sleeping', 'waiting') THEN u.outcome ELSE 'state_change' END,
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
), locked AS (
    -- LOCK ORDER (runtime/backend/workers.py): the rows are locked here, in id order, whatever join the
    -- planner picks for the UPDATE below; each is read as locked (a cancel request that committed while
    -- this waited for the row is seen). By primary key alone, as in job_finish_batch (joined with the
    -- batch, the planner scanned jobs from about 200 rows: 1,000 held among 20,000 jobs took 179 ms);
    -- coalesce: never a scan of jobs_running_lease_idx either (see job_finish_batch)
    SELECT j.id, j.attempt, j.claim_epoch, j.cancel_requested_at, j.schedule_to_close, j.scheduled_at
    FROM taskq.jobs AS j
    WHERE j.id = ANY(%(ids)s::uuid[]) AND coalesce(j.status, '') = 'running' AND j.worker_id = %(worker_id)s
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
), verdict AS (
    SELECT l.id, l.attempt, l.claim_epoch,
           CASE WHEN l.cancel_requested_at IS NOT NULL THEN 'cancelled'
                WHEN l.schedule_to_close IS NOT NULL AND l.schedule_to_close <= now() THEN 'failed'
                WHEN i.unsafe THEN 'crashed'
                WHEN l.scheduled_at > now() THEN 'scheduled'
                ELSE 'pending' END AS status
    FROM locked AS l JOIN i ON i.id = l.id AND i.attempt = l.attempt AND i.epoch = l.claim_epoch
), upd AS (
    UPDATE taskq.jobs AS j SET
        revision = j.revision + 1,
        status = v.status,
        interrupt_count = j.interrupt_count + CASE WHEN v.status IN ('pending', 'scheduled') THEN 1 ELSE 0 END,
        worker_id = CASE WHEN v.status IN ('pending', 'scheduled') THEN NULL ELSE j.worker_id END,
        wait_kind = NULL, wait_signal = NULL,
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
      AND j.worker_id = %(worker_id)s
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
  AND worker_id = %(worker_id)s
RETURNING id;

-- name: job_progress
-- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
UPDATE taskq.jobs SET revision = revision + 1, progress = %(progress)s::jsonb
WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
  AND worker_id = %(worker_id)s
RETURNING id;

-- name: job_cancel_escalate
-- CANCEL_ESCALATION_SQL (spec §3): phase 1 -> 2 on a row we hold, with its event; rowcount 0 = skip.
WITH upd AS (
    UPDATE taskq.jobs SET revision = revision + 1, cancel_phase = 2
    -- coalesce: by primary key, never a scan of jobs_running_lease_idx (see job_finish_batch)
    WHERE id = %(id)s AND coalesce(status, '') = 'running' AND attempt = %(attempt)s AND claim_epoch = %(epoch)s
      AND worker_id = %(worker_id)s AND cancel_phase = 1
    RETURNING id, attempt
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
    SELECT u.id, 'state_change', 'running', 'running', u.attempt, %(worker_id)s,
           jsonb_build_object('cancel_phase_from', 1, 'cancel_phase_to', 2, 'worker_id', %(worker_id)s::text)
    FROM upd AS u
)
SELECT id FROM upd;
