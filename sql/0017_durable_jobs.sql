-- taskq schema, version 17: durable jobs (issue 32).
--
-- Steps. `ctx.step(name, fn)` runs fn once per job: its result is stored in taskq.job_steps, keyed by the
-- job, the kind and the name, by the attempt that holds the job (the write locks the job's row FOR SHARE
-- and checks status, attempt and claim_epoch, so a stale attempt stores nothing: a reclaim, a cancel or a
-- finish either committed before the check, and the check fails, or waits for the step's commit). A later
-- attempt reads the stored result instead of running fn again. The same table remembers a job's sleeps
-- (kind 'sleep', named by their order in the run: '1', '2'...; wake_at) and its waits for a signal
-- (kind 'signal', named '<signal name>#<n>'; wake_at is the timeout, result the payload taken or
-- {"timeout": true}), so that a run after the wake-up goes through them without waiting again.
--
-- Sleeping and waiting. A sleep or a wait for a signal ends the attempt like taskq.Snooze: the job goes back
-- to 'scheduled' (scheduled_at = its wake-up, 9999-12-31 for a wait without timeout: a date Python can read), its attempt given
-- back to the budget, no worker and no lease; wait_kind says why ('sleep' or 'signal', with wait_signal the
-- name awaited). wait_kind is meaningful only while the row is 'scheduled': every statement that puts a
-- running job back to 'pending' or 'scheduled' otherwise (a retry, a release, a reclaim, a requeue) clears it.
--
-- Signals. taskq.job_signals keeps every signal sent to a job, in order; each is taken (consumed) once, by
-- the wait that returns it. Sending one to a job that waits for that name makes the job due at once. The
-- sender locks the job's row; the finish that suspends a job asks taskq.signal_ready_v17 whether a signal
-- of the awaited name is already there, and that function (VOLATILE, so it reads with a snapshot of its
-- own) also sees a signal whose sender committed while the finish waited for the row: a signal is never
-- left waiting behind a suspension that missed it.
--
-- Workflows. jobs.workflow_id: the graph a job belongs to (JobsClient.workflow(); children of a member
-- enqueued with ctx.jobs.enqueue inherit it), for cancelling a whole workflow.

ALTER TABLE taskq.jobs
    ADD COLUMN workflow_id uuid,
    ADD COLUMN wait_kind text,
    ADD COLUMN wait_signal text,
    ADD CONSTRAINT jobs_wait_kind_known CHECK (wait_kind IN ('sleep', 'signal')),
    ADD CONSTRAINT jobs_wait_signal_text CHECK (
        wait_signal <> '' AND length(wait_signal) <= 200 AND wait_signal !~ '[[:cntrl:]]'),
    ADD CONSTRAINT jobs_wait_signal_with_kind CHECK (wait_signal IS NULL OR wait_kind = 'signal');

-- the members of a workflow (cancel_workflow, the dashboard's workflow page); only workflow jobs have entries
CREATE INDEX jobs_workflow_idx ON taskq.jobs (workflow_id) WHERE workflow_id IS NOT NULL;
-- the jobs that sleep or wait for a signal (`taskq jobs --waiting`); only those have entries
CREATE INDEX jobs_waiting_idx ON taskq.jobs (wait_kind, scheduled_at)
    WHERE status = 'scheduled' AND wait_kind IS NOT NULL;

CREATE TABLE taskq.job_steps (
    job_id       uuid        NOT NULL,
    kind         text        NOT NULL CHECK (kind IN ('step', 'sleep', 'signal')),
    name         text        NOT NULL CHECK (name <> '' AND length(name) <= 255 AND name !~ '[[:cntrl:]]'),
    attempt      integer     NOT NULL CHECK (attempt >= 1),
    claim_epoch  bigint      NOT NULL CHECK (claim_epoch >= 1),
    result       jsonb,
    wake_at      timestamptz,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, kind, name)
);

CREATE TABLE taskq.job_signals (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id            uuid        NOT NULL,
    name              text        NOT NULL CHECK (name <> '' AND length(name) <= 200 AND name !~ '[[:cntrl:]]'),
    payload           jsonb,
    sent_at           timestamptz NOT NULL DEFAULT now(),
    sent_by           text,
    consumed_at       timestamptz,
    consumed_attempt  integer,
    consumed_epoch    bigint,
    consumed_by       text,
    CONSTRAINT job_signals_consumed_whole CHECK (
        (consumed_at IS NULL) = (consumed_attempt IS NULL)
        AND (consumed_at IS NULL) = (consumed_epoch IS NULL)
        AND (consumed_at IS NULL) = (consumed_by IS NULL))
);
-- a job's signals in order (taskq job, retention); the ones not yet taken, per name (a wait, the finish)
CREATE INDEX job_signals_job_idx ON taskq.job_signals (job_id, id);
CREATE INDEX job_signals_pending_idx ON taskq.job_signals (job_id, name, id) WHERE consumed_at IS NULL;

-- the timeline learns steps, signals and the two ways of suspending (NOT VALID as in migration 5)
ALTER TABLE taskq.job_events DROP CONSTRAINT IF EXISTS job_events_kind_check;
ALTER TABLE taskq.job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'state_change', 'cancel_requested', 'progress', 'note', 'snoozed', 'requeued', 'operator',
    'step', 'signal', 'sleeping', 'waiting')) NOT VALID;

-- an attempt can end in a sleep or a wait for a signal
ALTER TABLE taskq.job_attempts DROP CONSTRAINT IF EXISTS job_attempts_outcome_check;
ALTER TABLE taskq.job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (outcome IN (
    'succeeded', 'failed', 'retried', 'cancelled', 'abandoned', 'interrupted', 'crashed', 'stale',
    'snoozed', 'sleeping', 'waiting')) NOT VALID;

-- Is a signal named p_name waiting to be taken by job p_job? VOLATILE on purpose: called from the finish
-- that suspends a job, after that statement got the row lock, it reads with a snapshot taken then, and so
-- sees a signal whose sender held the row while the finish waited for it.
CREATE FUNCTION taskq.signal_ready_v17(p_job uuid, p_name text) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SET search_path = pg_catalog AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM taskq.job_signals AS s
                   WHERE s.job_id = p_job AND s.name = p_name AND s.consumed_at IS NULL);
END
$$;

-- Retention: a terminal job goes with its events, its edges, its step results and its signals
-- (delete_terminal_jobs of migration 11, and the two tables of this one).
CREATE FUNCTION taskq.delete_terminal_jobs_v17(p_ids uuid[], OUT jobs bigint, OUT events bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.jobs AS j
        WHERE j.id = ANY(p_ids) AND j.status IN ('succeeded', 'cancelled', 'failed', 'crashed', 'abandoned')
          AND NOT (j.has_dependents AND EXISTS (
              SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c ON c.id = d.child_id
              WHERE d.parent_id = j.id
                AND c.status NOT IN ('succeeded', 'cancelled', 'failed', 'crashed', 'abandoned')))
        RETURNING j.id, j.has_dependents
    ), ev AS (
        DELETE FROM taskq.job_events AS e USING gone AS g WHERE e.job_id = g.id
        RETURNING 1
    ), edges AS (
        DELETE FROM taskq.job_dependencies AS d USING gone AS g WHERE d.child_id = g.id OR d.parent_id = g.id
    ), backlog AS (
        DELETE FROM taskq.dependency_backlog AS b USING gone AS g WHERE g.has_dependents AND b.parent_id = g.id
    ), steps AS (
        DELETE FROM taskq.job_steps AS s USING gone AS g WHERE s.job_id = g.id
    ), signals AS (
        DELETE FROM taskq.job_signals AS s USING gone AS g WHERE s.job_id = g.id
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM ev)
$$;
REVOKE ALL ON FUNCTION taskq.delete_terminal_jobs_v17(uuid[]) FROM PUBLIC;

ALTER TABLE taskq.job_steps SET (autovacuum_vacuum_scale_factor = 0.05);
ALTER TABLE taskq.job_signals SET (autovacuum_vacuum_scale_factor = 0.05);
