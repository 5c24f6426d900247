-- taskq schema: queue control (pause/resume, fleet-wide concurrency limits, rate limits).
--
-- A queue becomes a row the first time it is used (a worker registers for it, an operator pauses or
-- limits it); jobs still name their queue by string, with no foreign key, so an enqueue never waits on
-- this table. Actor limits are declared in code (`@actor(global_concurrency=...)`) and written here by
-- the workers that declare them, so every worker of the fleet, whatever code it runs, claims under the
-- same limits.
--
-- How a limit holds (sql/worker.sql, job_claim_limited): a claim that may take limited work first locks
-- the scope rows (these queues rows, then every actor_limits row, each in name order) in one statement,
-- then counts and claims in a second statement, whose snapshot is taken after the locks were granted,
-- so it sees every earlier claimer's commit. A slot is a running row: it stops counting in the very
-- transaction that moves the row out of 'running' (finish, release, reclaim), with nothing to free.
-- Starts for rate limits are logged in rate_starts, by the limited claim only.

CREATE TABLE taskq.queues (
    name                text        PRIMARY KEY CHECK (name <> '' AND length(name) <= 255),
    paused_at           timestamptz,
    paused_by           text,
    pause_reason        text,
    concurrency_limit   integer     CHECK (concurrency_limit >= 1),
    concurrency_per_key integer     CHECK (concurrency_per_key >= 1),
    rate_limit          integer     CHECK (rate_limit >= 1),
    rate_period         float8      CHECK (rate_period > 0 AND rate_period < 'infinity'),
    -- the plain claim (job_claim) leaves a controlled queue to the limited claim, or to nobody while paused
    controlled          boolean     GENERATED ALWAYS AS (
                            paused_at IS NOT NULL OR concurrency_limit IS NOT NULL
                            OR concurrency_per_key IS NOT NULL OR rate_limit IS NOT NULL) STORED,
    created_at          timestamptz NOT NULL DEFAULT now(),
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_rate_has_period CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT queues_paused_has_by CHECK (paused_at IS NOT NULL OR (paused_by IS NULL AND pause_reason IS NULL))
);

CREATE TABLE taskq.actor_limits (
    actor               text        PRIMARY KEY CHECK (actor <> '' AND length(actor) <= 255),
    global_concurrency  integer     CHECK (global_concurrency >= 1),
    concurrency_per_key integer     CHECK (concurrency_per_key >= 1),
    rate_limit          integer     CHECK (rate_limit >= 1),
    rate_period         float8      CHECK (rate_period > 0 AND rate_period < 'infinity'),
    declared_by         text,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT actor_limits_rate_has_period CHECK ((rate_limit IS NULL) = (rate_period IS NULL)),
    CONSTRAINT actor_limits_some_limit CHECK (
        global_concurrency IS NOT NULL OR concurrency_per_key IS NOT NULL OR rate_limit IS NOT NULL)
);

-- the operator's timeline of a queue: pause, resume, limit changes, each with who and why
CREATE TABLE taskq.queue_events (
    id      bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue   text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind    text        NOT NULL CHECK (kind IN ('paused', 'resumed', 'limits')),
    done_by text,
    reason  text,
    detail  jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX queue_events_queue_idx ON taskq.queue_events (queue, id);

-- one row per start of a rate-limited scope ('queue:<name>' or 'actor:<name>'); the limited claim counts
-- the window and trims what is older than it, under the scope's lock
CREATE TABLE taskq.rate_starts (
    scope      text        NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX rate_starts_scope_idx ON taskq.rate_starts (scope, started_at);
ALTER TABLE taskq.rate_starts SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- per-key limits: the key a job was enqueued with (concurrency_key=), NULL for none
ALTER TABLE taskq.jobs ADD COLUMN concurrency_key text
    CONSTRAINT jobs_concurrency_key_length CHECK (concurrency_key <> '' AND length(concurrency_key) <= 255);

-- the running rows, by queue, actor and key: the slots in use (counted by the limited claim, queue_stats).
-- One index, not one per scope: each claim pays one more index entry per job (a claim is never a HOT
-- update). An actor's count reads the running rows of every queue from it: as many as run at once,
-- never the backlog (PostgreSQL 18 skips through it by queue).
-- `queue IS NOT NULL` (always true: the column is NOT NULL) keeps the index to the statements that say
-- so or compare queue: with `status = 'running'` alone, the planner took it for the heartbeat's cancel
-- poll (every running row of every worker, instead of jobs_cancel_held_idx's few).
CREATE INDEX jobs_running_scope_idx ON taskq.jobs (queue, actor, concurrency_key)
    WHERE status = 'running' AND queue IS NOT NULL;
-- the waiting rows of a limited actor in one queue, in claim order (the limited claim's scan)
CREATE INDEX jobs_claim_actor_idx ON taskq.jobs (actor, queue, priority, scheduled_at, id)
    WHERE status IN ('pending', 'scheduled');
-- queue_stats: jobs waiting for their parents (status added by job dependencies; empty until then)
CREATE INDEX jobs_awaiting_queue_idx ON taskq.jobs (queue) WHERE status = 'awaiting_parents';
