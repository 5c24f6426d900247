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
-- statement wrapped in a CTE. With notify false the NOTIFY is left to a later jobs_notify (backend_notify).
INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                        scheduled_at, schedule_to_close, parent_id, idempotent, trace_context, concurrency_key)
VALUES (%(id)s, %(actor)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s, %(idempotent)s,
        %(trace_context)s::jsonb, %(concurrency_key)s::text)
RETURNING status, scheduled_at, schedule_to_close, created_at,
          (CASE WHEN %(notify)s::bool AND status = 'pending' THEN pg_notify('taskq_jobs', queue) END) IS NULL AS _n;

-- name: job_insert_many
-- One statement per batch of one enqueue_many call: only ids and payloads vary, sent as binary arrays
-- (text-format arrays cost microseconds per element to quote); the options are shared scalars. One
-- NOTIFY for the whole batch when its jobs are due now.
WITH ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, idempotent, trace_context, concurrency_key)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid,
           %(idempotent)s::boolean, %(trace_context)s::jsonb, %(concurrency_key)s::text
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[]) AS u(id, payload)
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
                        scheduled_at, schedule_to_close, parent_id, idempotent, unique_key, unique_scope,
                        trace_context, concurrency_key)
VALUES (%(id)s, %(actor)s, %(queue)s, %(payload)s::jsonb,
        CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
        %(priority)s, %(tags)s::text[], %(max_attempts)s,
        greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
        now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s, %(idempotent)s,
        %(unique_key)s, %(unique_scope)s, %(trace_context)s::jsonb, %(concurrency_key)s::text)
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
WITH ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, idempotent, unique_key, unique_scope,
                            trace_context, concurrency_key)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb,
           CASE WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled' ELSE 'pending' END,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid,
           %(idempotent)s::boolean, u.key, CASE WHEN u.key IS NOT NULL THEN %(unique_scope)s::text END,
           %(trace_context)s::jsonb, %(concurrency_key)s::text
    FROM unnest(%(ids)b::uuid[], %(payloads)b::text[], %(unique_keys)b::text[]) AS u(id, payload, key)
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
      AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
      AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
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
        started_at = NULL, finished_at = NULL, worker_id = NULL,
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
               'max_attempts_to', u.max_attempts, 'error_class', t.error_class))
    FROM upd AS u JOIN target AS t ON t.id = u.id
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
      AND (%(tags)s::text[] IS NULL OR tags @> %(tags)s::text[])
      AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
      AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
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
        started_at = NULL, finished_at = NULL, worker_id = NULL,
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
               'max_attempts_to', u.max_attempts, 'error_class', d.error_class))
    FROM upd AS u JOIN decided AS d ON d.id = u.id
), notified AS (
    SELECT pg_notify('taskq_jobs', q.queue) FROM (SELECT DISTINCT queue FROM upd) AS q
)
SELECT d.id, d.prev, u.id IS NOT NULL AS requeued, d.conflict_job_id,
       (SELECT count(*) FROM notified) AS _n
FROM decided AS d LEFT JOIN upd AS u ON u.id = d.id
ORDER BY d.id;

-- ---- dependencies (taskq.workflows through the Backend) ---------------------------------------------

-- name: job_insert_dependent
-- Jobs that wait on parents (enqueue with depends_on, one node of a workflow, or an enqueue_many sharing
-- its parents): every option shared, ids and payloads as arrays, the same parents for every job. The
-- parents are locked first (FOR NO KEY UPDATE, in id order), and their status read under the lock: a
-- parent whose terminal write is in flight either committed before (its status here is terminal, and the
-- edge is born resolved) or waits for this transaction and then finds the edge (jobs_settle_dependents).
-- A parent already terminal resolves its edge at once by the cascade's rules: the job is cancelled
-- (ParentFailed) in mode on_success if a parent ended other than succeeded, released if none is left.
-- Writes nothing when a parent does not exist (`missing` lists them; the caller rolls back the lock's
-- has_dependents mark with its transaction).
WITH locked AS (
    SELECT id, status, has_dependents FROM taskq.jobs
    WHERE id = ANY(%(parent_ids)s::uuid[])
    ORDER BY id
    FOR NO KEY UPDATE
), mark AS (
    UPDATE taskq.jobs AS j SET revision = j.revision + 1, has_dependents = true
    FROM locked AS l WHERE j.id = l.id AND NOT l.has_dependents
), v AS (
    SELECT count(*) AS found,
           count(*) FILTER (WHERE status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned'))::int
               AS remaining,
           min(status) FILTER (WHERE status IN ('failed', 'cancelled', 'crashed', 'abandoned')) AS failed,
           min(id::text) FILTER (WHERE status IN ('failed', 'cancelled', 'crashed', 'abandoned'))::uuid
               AS failed_parent
    FROM locked
), decided AS (
    SELECT v.*,
           CASE WHEN v.failed IS NOT NULL AND %(dependency_mode)s::text = 'on_success' THEN 'cancelled'
                WHEN v.remaining > 0 THEN 'awaiting_parents'
                WHEN %(scheduled_at)s::timestamptz > now() THEN 'scheduled'
                ELSE 'pending' END AS status
    FROM v WHERE v.found = cardinality(%(parent_ids)s::uuid[])
), ins AS (
    INSERT INTO taskq.jobs (id, actor, queue, payload, status, priority, tags, max_attempts,
                            scheduled_at, schedule_to_close, parent_id, idempotent, trace_context, concurrency_key,
                            parents_remaining, dependency_mode,
                            cancel_requested_at, cancel_reason, error_class, error_message, finished_at)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb, d.status,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid,
           %(idempotent)s::boolean, %(trace_context)s::jsonb, %(concurrency_key)s::text,
           d.remaining, %(dependency_mode)s::text,
           CASE WHEN d.status = 'cancelled' THEN now() END,
           CASE WHEN d.status = 'cancelled' THEN 'parent-failure:' || d.failed END,
           CASE WHEN d.status = 'cancelled' THEN 'ParentFailed' END,
           CASE WHEN d.status = 'cancelled' THEN format('parent %%s ended %%s', d.failed_parent, d.failed) END,
           CASE WHEN d.status = 'cancelled' THEN now() END
    FROM decided AS d, unnest(%(ids)b::uuid[], %(payloads)b::text[]) AS u(id, payload)
    RETURNING id, status, scheduled_at, schedule_to_close, created_at
), edges AS (
    INSERT INTO taskq.job_dependencies (parent_id, child_id, resolved_at, parent_status)
    SELECT l.id, i.id,
           CASE WHEN l.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned') THEN now() END,
           CASE WHEN l.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned') THEN l.status END
    FROM locked AS l, ins AS i
), ev AS (
    INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
    SELECT i.id, 'state_change', 'awaiting_parents', i.status, 0,
           CASE WHEN i.status = 'cancelled'
                THEN jsonb_build_object('cause', 'parent-failure:' || d.failed, 'parent_id', d.failed_parent,
                                        'error_class', 'ParentFailed', 'at_enqueue', true)
                ELSE jsonb_build_object('cause', 'parents-settled', 'at_enqueue', true) END
    FROM ins AS i, decided AS d WHERE i.status <> 'awaiting_parents'
)
SELECT (SELECT status FROM decided) AS status,
       (SELECT scheduled_at FROM ins LIMIT 1) AS scheduled_at,
       (SELECT schedule_to_close FROM ins LIMIT 1) AS schedule_to_close,
       (SELECT created_at FROM ins LIMIT 1) AS created_at,
       ARRAY(SELECT p FROM unnest(%(parent_ids)s::uuid[]) AS p EXCEPT SELECT id FROM locked) AS missing,
       (CASE WHEN %(notify)s::bool AND (SELECT status FROM decided) = 'pending'
             THEN pg_notify('taskq_jobs', %(queue)s::text) END) IS NULL AS _n;

-- name: job_dependencies
-- `taskq job ID` and JobsClient.dependencies: the job's parents (with their status now and how the edge
-- resolved) and its children.
SELECT 'parent' AS side, d.parent_id AS job_id, j.status, j.actor, d.resolved_at, d.parent_status
FROM taskq.job_dependencies AS d LEFT JOIN taskq.jobs AS j ON j.id = d.parent_id
WHERE d.child_id = %(id)s
UNION ALL
SELECT 'child', d.child_id, j.status, j.actor, d.resolved_at, d.parent_status
FROM taskq.job_dependencies AS d LEFT JOIN taskq.jobs AS j ON j.id = d.child_id
WHERE d.parent_id = %(id)s
ORDER BY 1 DESC, 2;

-- name: job_parent_results
-- ctx.parent_results(): every parent's actor, status and stored result (NULL unless it succeeded).
SELECT d.parent_id, j.actor, j.status, j.result
FROM taskq.job_dependencies AS d JOIN taskq.jobs AS j ON j.id = d.parent_id
WHERE d.child_id = %(id)s
ORDER BY d.parent_id;

-- name: job_revive_dependents
-- requeue(..., cascade=True), after the parents' requeue in the same transaction: the children that the
-- cascade cancelled (ParentFailed) because of these parents go back to awaiting_parents, and so on down
-- the graph, through taskq.revive_dependents. Returns the jobs revived.
SELECT r.id FROM taskq.revive_dependents(%(ids)s::uuid[], %(reason)s::text) AS r(id);
