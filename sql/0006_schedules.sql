-- taskq schema, version 6: periodic schedules (cron or fixed intervals), exactly one job per slot.
--
-- A schedule is a row; every worker's scheduler may fire it. A tick locks the due rows (FOR UPDATE SKIP
-- LOCKED), inserts their slot jobs and moves next_run_at past the database's now() in one transaction,
-- so two schedulers never work on one schedule at once, and a slot behind next_run_at is never made
-- again: next_run_at only moves forward, and retention deletes a slot job only after that.
-- Each slot job also carries the unique key `schedule:<name>:<slot time, UTC>` with unique_scope
-- 'retained' (migration 3's index): while that job is stored, nobody can insert a second job for its
-- slot, whatever the state of the schedules row. Depends on migration 3 for those columns.

CREATE TABLE taskq.schedules (
    name          text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 200),
    actor         text        NOT NULL CHECK (actor <> '' AND length(actor) <= 255),
    queue         text        NOT NULL CHECK (queue <> '' AND length(queue) <= 255),
    payload       jsonb       NOT NULL DEFAULT 'null',
    priority      integer     NOT NULL DEFAULT 0,
    tags          text[]      NOT NULL DEFAULT '{}',
    max_attempts  integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    -- the slot sequence: a cron expression in a time zone, or a whole number of seconds
    cron          text,
    every_seconds integer     CHECK (every_seconds >= 1),
    timezone      text        NOT NULL DEFAULT 'UTC',
    definition    text        NOT NULL,
    misfire       text        NOT NULL DEFAULT 'skip' CHECK (misfire IN ('skip', 'run_once', 'catch_up')),
    max_catch_up  integer     NOT NULL DEFAULT 10 CHECK (max_catch_up >= 1),
    misfire_grace float8      NOT NULL DEFAULT 60 CHECK (misfire_grace >= 0),
    overlap       text        NOT NULL DEFAULT 'allow' CHECK (overlap IN ('allow', 'skip')),
    -- state: enabled is false once the code that declared the schedule no longer does (never deleted);
    -- paused_at is the operator's
    enabled       boolean     NOT NULL DEFAULT true,
    paused_at     timestamptz,
    paused_by     text,
    -- set by a resume (and by a re-declaration of a disabled schedule): the slots before it passed while
    -- nothing was allowed to run them, so they are misfires however recent
    resumed_at    timestamptz,
    next_run_at   timestamptz NOT NULL,
    last_run_at   timestamptz,
    last_job_id   uuid,
    last_outcome  text        CHECK (last_outcome IN ('enqueued', 'triggered', 'skipped_overlap', 'missed')),
    missed_total  bigint      NOT NULL DEFAULT 0 CHECK (missed_total >= 0),
    owner         text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_cron_or_every CHECK ((cron IS NULL) <> (every_seconds IS NULL))
);

-- the tick's scan: the schedules that can be due, earliest first
CREATE INDEX schedules_due_idx ON taskq.schedules (next_run_at) WHERE enabled AND paused_at IS NULL;

-- the job's schedule and nominal slot time (ctx.scheduled_for); NULL for jobs no schedule made
ALTER TABLE taskq.jobs
    ADD COLUMN schedule      text,
    ADD COLUMN scheduled_for timestamptz,
    ADD CONSTRAINT jobs_schedule_slot CHECK ((schedule IS NULL) = (scheduled_for IS NULL));
