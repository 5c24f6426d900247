-- taskq schema, version 5: retention by terminal class, snooze, non-idempotent actors (issue 14).
-- Independent of migration 3.

-- Pruning by class: one partial index per retention class, ordered by finished_at, so that a prune
-- batch reads the oldest rows of its class and stops at its LIMIT, whatever else the table holds. A
-- finish already rewrites the row's index entries (status is in every partial index's predicate), so
-- each costs one more index insert per finished job and nothing on the claim or the heartbeat.
CREATE INDEX jobs_retention_succeeded_idx ON taskq.jobs (finished_at)
    WHERE status IN ('succeeded', 'cancelled');
CREATE INDEX jobs_retention_failed_idx ON taskq.jobs (finished_at)
    WHERE status IN ('failed', 'crashed', 'abandoned');
-- Attempts rows are kept longer than their jobs and pruned on their own window; an open attempt
-- (finished_at NULL) is never pruned.
CREATE INDEX job_attempts_retention_idx ON taskq.job_attempts (finished_at)
    WHERE finished_at IS NOT NULL;

-- The delete half of a prune batch. The worker role has no DELETE on jobs, job_events or job_attempts
-- (sql/roles.sql): it prunes through these two functions, which run as the schema owner and delete only
-- what retention may delete, whatever ids they are given: terminal jobs with their events, and finished
-- attempts rows. The prune statements (sql/worker.sql) choose the batch, index-backed, with SKIP LOCKED.
CREATE FUNCTION taskq.delete_terminal_jobs(p_ids uuid[], OUT jobs bigint, OUT events bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.jobs
        WHERE id = ANY(p_ids) AND status IN ('succeeded', 'cancelled', 'failed', 'crashed', 'abandoned')
        RETURNING id
    ), ev AS (
        DELETE FROM taskq.job_events AS e USING gone AS g WHERE e.job_id = g.id
        RETURNING 1
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM ev)
$$;
CREATE FUNCTION taskq.delete_finished_attempts(p_jobs uuid[], p_epochs bigint[], OUT attempts bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.job_attempts AS a
        USING unnest(p_jobs, p_epochs) AS d(job_id, claim_epoch)
        WHERE a.job_id = d.job_id AND a.claim_epoch = d.claim_epoch AND a.finished_at IS NOT NULL
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
REVOKE ALL ON FUNCTION taskq.delete_terminal_jobs(uuid[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION taskq.delete_finished_attempts(uuid[], bigint[]) FROM PUBLIC;

-- Snooze: the number of times the actor asked to run later. A snooze gives its attempt back to the
-- budget (max_attempts + 1) while attempt and claim_epoch still rise at the next claim, so fences and
-- attempt numbers stay monotonic.
ALTER TABLE taskq.jobs ADD COLUMN snooze_count integer NOT NULL DEFAULT 0 CHECK (snooze_count >= 0);

-- A job whose actor declared idempotent=False: after a crash or a lost lease it is not retried but
-- ends crashed (WorkerCrashed) for an operator to review. Written at enqueue when the producer knows
-- the actor, else by the worker before it first runs such an actor; read by every reclaimer (sweeper,
-- supervisor), which need not know the actor.
ALTER TABLE taskq.jobs ADD COLUMN idempotent boolean NOT NULL DEFAULT true;

-- New kinds of timeline events and attempt outcomes. The kind check is replaced by name whatever
-- migration 3 did to it: the list below keeps every kind issue 14 defines ('requeued' included).
-- NOT VALID: every existing row passed the narrower check it replaces, and a validation would scan
-- the whole timeline under this migration's lock.
ALTER TABLE taskq.job_events DROP CONSTRAINT IF EXISTS job_events_kind_check;
ALTER TABLE taskq.job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'state_change', 'cancel_requested', 'progress', 'note', 'snoozed', 'requeued')) NOT VALID;
ALTER TABLE taskq.job_attempts DROP CONSTRAINT IF EXISTS job_attempts_outcome_check;
ALTER TABLE taskq.job_attempts ADD CONSTRAINT job_attempts_outcome_check CHECK (outcome IN (
    'succeeded', 'failed', 'retried', 'cancelled', 'abandoned', 'interrupted', 'crashed', 'stale',
    'snoozed')) NOT VALID;
