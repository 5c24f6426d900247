-- Queries used by JobsClient, the CLI and the migration runner. Parameters are psycopg %(name)s.

-- name: migrations_bootstrap
CREATE SCHEMA IF NOT EXISTS taskq;
CREATE TABLE IF NOT EXISTS taskq.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migrations_applied
SELECT version, name, checksum FROM taskq.schema_migrations ORDER BY version;

-- name: migrations_record
INSERT INTO taskq.schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM taskq.schema_migrations;

-- name: job_insert
-- Returns only what the server decides; the client knows the rest of the row it sent. A plain
-- INSERT ... RETURNING (the NOTIFY in the RETURNING list) costs the server a sixth less than the same
-- statement wrapped in a CTE.
INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                        scheduled_at, schedule_to_close, parent_id)
VALUES (%(id)s, %(actor)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s)
RETURNING status, scheduled_at, schedule_to_close, created_at,
          (CASE WHEN status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n;

-- name: job_insert_many
-- One statement per batch of one enqueue_many call: only ids and payloads vary, sent as binary arrays
-- (text-format arrays cost microseconds per element to quote); the options are shared scalars. One
-- NOTIFY for the whole batch when its jobs are due now.
WITH ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[]) AS u(id, payload)
    RETURNING status
)
SELECT count(*) AS inserted,
       (CASE WHEN bool_or(status = 'pending') THEN pg_notify('taskq_jobs', %(queue)s::text) END) IS NULL AS _n
FROM ins;

-- name: job_insert_unique
-- job_insert for a job with a unique key: writes nothing (returns no row) when another job holds the
-- key in jobs_unique_key_idx. The conflict target names that index by its column and predicate.
INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                        scheduled_at, schedule_to_close, parent_id, unique_key, unique_scope)
VALUES (%(id)s, %(actor)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s,
        %(unique_key)s, %(unique_scope)s)
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'))
    DO NOTHING
RETURNING status, scheduled_at, schedule_to_close, created_at,
          (CASE WHEN status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n;

-- name: job_unique_holder
-- The job a new row with this key conflicts with (at most one, by jobs_unique_key_idx).
SELECT * FROM taskq.jobs
WHERE unique_key = %(unique_key)s
  AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'));

-- name: job_insert_many_unique
-- job_insert_many with one unique key (or NULL) per job; returns the ids it wrote.
WITH ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, unique_key, unique_scope)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid,
           u.key, CASE WHEN u.key IS NOT NULL THEN %(unique_scope)s::text END
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[], %(unique_keys)b::text[]) AS u(id, payload, key)
    ON CONFLICT (unique_key)
        WHERE unique_key IS NOT NULL AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'))
        DO NOTHING
    RETURNING id, status
)
SELECT array_agg(id) AS written,
       (CASE WHEN bool_or(status = 'pending') THEN pg_notify('taskq_jobs', %(queue)s::text) END) IS NULL AS _n
FROM ins;

-- name: job_unique_holders
-- job_unique_holder for many keys: (key, holder id) per key held.
SELECT unique_key, id FROM taskq.jobs
WHERE unique_key = ANY(%(unique_keys)s::text[])
  AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'));

-- name: job_get
SELECT * FROM taskq.jobs WHERE id = %(id)s;

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
  AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
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
        status = CASE WHEN t.prev = 'running' THEN j.status ELSE 'cancelled' END,
        cancel_phase = CASE WHEN t.prev = 'running' THEN greatest(j.cancel_phase, 1) ELSE j.cancel_phase END,
        cancel_requested_at = now(),
        cancel_reason = %(reason)s,
        error_class = CASE WHEN t.prev = 'running' THEN j.error_class ELSE 'CancelledBeforeStart' END,
        finished_at = CASE WHEN t.prev = 'running' THEN j.finished_at ELSE now() END
    FROM target AS t
    WHERE j.id = t.id
      AND (t.prev IN ('pending', 'scheduled') OR (t.prev = 'running' AND j.cancel_requested_at IS NULL))
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
      AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
      AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
      AND (status IN ('pending', 'scheduled') OR (status = 'running' AND cancel_requested_at IS NULL))
    ORDER BY id
    LIMIT %(limit)s
    FOR UPDATE
), upd AS (
    UPDATE taskq.jobs AS j SET
        status = CASE WHEN t.prev = 'running' THEN j.status ELSE 'cancelled' END,
        cancel_phase = CASE WHEN t.prev = 'running' THEN greatest(j.cancel_phase, 1) ELSE j.cancel_phase END,
        cancel_requested_at = now(),
        cancel_reason = %(reason)s,
        error_class = CASE WHEN t.prev = 'running' THEN j.error_class ELSE 'CancelledBeforeStart' END,
        finished_at = CASE WHEN t.prev = 'running' THEN j.finished_at ELSE now() END
    FROM target AS t
    WHERE j.id = t.id
      AND (j.status IN ('pending', 'scheduled') OR (j.status = 'running' AND j.cancel_requested_at IS NULL))
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

-- ---- schedules (taskq.schedule_admin through the Backend) ------------------------------------------

-- name: schedule_list
SELECT s.name, s.actor, s.queue, s.cron, s.every_seconds, s.timezone, s.misfire, s.overlap, s.enabled,
       s.paused_at IS NOT NULL AS paused, s.paused_at, s.paused_by, s.next_run_at, s.last_run_at, s.last_job_id,
       s.last_outcome, j.status AS last_job_status, s.missed_total, s.owner, s.updated_at
FROM taskq.schedules AS s
LEFT JOIN taskq.jobs AS j ON j.id = s.last_job_id
WHERE %(name)s::text IS NULL OR s.name = %(name)s::text
ORDER BY s.name;

-- name: schedule_set_paused
-- Pause (or resume) one schedule; `changed` is false when it already was so. A paused schedule makes no
-- slot job; on resume the slots it passed are misfires, handled by its misfire policy.
WITH old AS (
    SELECT name, paused_at IS NOT NULL AS was_paused FROM taskq.schedules WHERE name = %(name)s FOR UPDATE
), upd AS (
    UPDATE taskq.schedules AS s SET
        paused_at = CASE WHEN %(paused)s::boolean THEN coalesce(s.paused_at, now()) END,
        paused_by = CASE WHEN %(paused)s::boolean THEN coalesce(s.paused_by, %(by)s::text) END,
        resumed_at = CASE WHEN %(paused)s::boolean THEN s.resumed_at ELSE now() END,
        updated_at = now()
    FROM old
    WHERE s.name = old.name AND old.was_paused IS DISTINCT FROM %(paused)s::boolean
    RETURNING s.name
)
SELECT old.name, (SELECT count(*) FROM upd) > 0 AS changed FROM old;

-- name: schedule_trigger
-- One job now, outside the slot sequence, whatever the schedule's state (paused, disabled or not).
-- Its scheduled_for is the trigger's instant, never a whole second (slot times are), and it has no
-- unique key: it never takes a slot's place. It becomes the schedule's last job (overlap='skip' waits
-- for it).
WITH s AS (
    SELECT * FROM taskq.schedules WHERE name = %(name)s FOR UPDATE
), ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at,
                            schedule, scheduled_for)
    SELECT %(id)s, s.actor, s.queue, s.payload, 'pending', s.priority, s.tags, s.max_attempts, now(), s.name,
           now() + CASE WHEN date_trunc('second', now()) = now() THEN interval '1 microsecond'
                        ELSE interval '0' END
    FROM s
    RETURNING id, schedule, scheduled_for, queue
), upd AS (
    UPDATE taskq.schedules AS t SET last_job_id = ins.id, last_run_at = ins.scheduled_for,
        last_outcome = 'triggered', updated_at = now()
    FROM ins WHERE t.name = ins.schedule
)
SELECT ins.id, ins.scheduled_for, pg_notify('taskq_jobs', ins.queue) IS NULL AS _n FROM ins;
