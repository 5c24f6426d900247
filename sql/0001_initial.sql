-- taskq schema, version 1. Never edit after release: add a new numbered file instead.

CREATE TABLE taskq.jobs (
    id                  uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    actor               text        NOT NULL CHECK (actor <> '' AND length(actor) <= 255),
    queue               text        NOT NULL DEFAULT 'default' CHECK (queue <> '' AND length(queue) <= 255),
    payload             jsonb       NOT NULL DEFAULT 'null',
    result              jsonb,
    status              text        NOT NULL DEFAULT 'pending' CHECK (status IN (
                            'pending', 'scheduled', 'running',
                            'succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')),
    priority            integer     NOT NULL DEFAULT 0,
    tags                text[]      NOT NULL DEFAULT '{}',
    attempt             integer     NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts        integer     NOT NULL DEFAULT 3 CHECK (max_attempts >= 1),
    claim_epoch         bigint      NOT NULL DEFAULT 0 CHECK (claim_epoch >= 0),
    interrupt_count     integer     NOT NULL DEFAULT 0 CHECK (interrupt_count >= 0),
    scheduled_at        timestamptz NOT NULL DEFAULT now(),
    -- absolute deadline: the job must reach a terminal state before this instant
    schedule_to_close   timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    started_at          timestamptz,
    finished_at         timestamptz,
    worker_id           text,
    lock_expires_at     timestamptz,
    cancel_phase        smallint    NOT NULL DEFAULT 0 CHECK (cancel_phase BETWEEN 0 AND 2),
    cancel_requested_at timestamptz,
    cancel_reason       text,
    error_class         text,
    error_message       text,
    progress            jsonb,
    parent_id           uuid,
    -- invariant 3: a cancelled row always carries a real cancel request
    CONSTRAINT jobs_cancelled_has_request CHECK (status <> 'cancelled' OR cancel_requested_at IS NOT NULL),
    -- a running row is always held by a worker under a lease
    CONSTRAINT jobs_running_is_held CHECK (
        status <> 'running' OR (worker_id IS NOT NULL AND lock_expires_at IS NOT NULL)),
    CONSTRAINT jobs_terminal_has_finished_at CHECK (
        status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned') OR finished_at IS NOT NULL)
);

-- room on each page for the heartbeat's lease renewals to stay HOT (same-page) updates
ALTER TABLE taskq.jobs SET (fillfactor = 70);

-- the claim: due pending/scheduled rows per queue, most urgent (lowest priority value) first
CREATE INDEX jobs_claim_idx ON taskq.jobs (queue, priority, scheduled_at, id)
    WHERE status IN ('pending', 'scheduled');
-- the heartbeat (every row one worker holds) and the lock-expiry sweep (it scans only the running
-- rows, as many as are in flight). lock_expires_at itself is deliberately not indexed: a lease
-- renewal then touches no indexed column and is a HOT update (with the fillfactor below), which
-- halves the heartbeat's cost per held job.
CREATE INDEX jobs_running_lease_idx ON taskq.jobs (worker_id) WHERE status = 'running';
CREATE INDEX jobs_tags_idx ON taskq.jobs USING gin (tags);
CREATE INDEX jobs_created_at_idx ON taskq.jobs (created_at);
CREATE INDEX jobs_parent_idx ON taskq.jobs (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE taskq.job_events (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id      uuid        NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind        text        NOT NULL CHECK (kind IN ('state_change', 'cancel_requested', 'progress', 'note')),
    from_status text,
    to_status   text,
    attempt     integer,
    worker_id   text,
    detail      jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX job_events_job_idx ON taskq.job_events (job_id, id);

-- one row per claim; kept longer than jobs (no foreign key on purpose)
CREATE TABLE taskq.job_attempts (
    job_id        uuid        NOT NULL,
    attempt       integer     NOT NULL,
    claim_epoch   bigint      NOT NULL,
    worker_id     text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz,
    outcome       text        CHECK (outcome IN (
                      'succeeded', 'failed', 'retried', 'cancelled', 'abandoned',
                      'interrupted', 'crashed', 'stale')),
    error_class   text,
    error_message text,
    PRIMARY KEY (job_id, claim_epoch)
);
CREATE INDEX job_attempts_open_idx ON taskq.job_attempts (worker_id) WHERE finished_at IS NULL;

CREATE TABLE taskq.workers (
    id                text        PRIMARY KEY,
    host              text        NOT NULL,
    pid               integer     NOT NULL,
    queues            text[]      NOT NULL,
    concurrency       integer     NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now(),
    last_heartbeat_at timestamptz NOT NULL DEFAULT now(),
    stopping          boolean     NOT NULL DEFAULT false
);
CREATE INDEX workers_heartbeat_idx ON taskq.workers (last_heartbeat_at);
