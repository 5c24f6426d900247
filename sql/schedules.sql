-- Schedules (taskq.backend.core for operators, taskq.backend.schedules for the worker's scheduler). Parameters are psycopg %(name)s.

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
