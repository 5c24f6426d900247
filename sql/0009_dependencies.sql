-- taskq schema: job dependencies (workflows). A child job waits in status awaiting_parents until its
-- parents are terminal; it is then released (pending, or scheduled if its scheduled_at is ahead) or, in
-- mode on_success, cancelled at once when a parent ends other than succeeded (error_class ParentFailed,
-- cancel_reason 'parent-failure:<status>'). The cascade runs in the parent's own terminal transaction,
-- from one row trigger that every terminal write passes, whatever statement wrote it.

-- awaiting_parents: non-terminal and never claimed (the claim and its index read pending and scheduled
-- only). NOT VALID: every stored row passed the narrower check this one replaces.
ALTER TABLE taskq.jobs DROP CONSTRAINT jobs_status_check;
ALTER TABLE taskq.jobs ADD CONSTRAINT jobs_status_check CHECK (status IN (
    'pending', 'scheduled', 'running', 'awaiting_parents',
    'succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')) NOT VALID;

-- has_dependents: set (under the parent's row lock) by the enqueue of a child, never cleared; it is what
--   the trigger's WHEN reads, so the terminal write of a job nobody depends on costs nothing more.
-- parents_remaining: the parents of an awaiting_parents job not yet terminal (its unresolved edges).
-- dependency_mode: NULL for a job without parents.
ALTER TABLE taskq.jobs
    ADD COLUMN has_dependents    boolean NOT NULL DEFAULT false,
    ADD COLUMN parents_remaining integer NOT NULL DEFAULT 0
        CONSTRAINT jobs_parents_remaining_positive CHECK (parents_remaining >= 0),
    ADD COLUMN dependency_mode   text
        CONSTRAINT jobs_dependency_mode_known CHECK (dependency_mode IN ('on_success', 'on_any_terminal'));

-- The edges. resolved_at is set once, when the parent is terminal (or at the child's enqueue if it
-- already was), and parent_status records how it ended: a resolution only ever updates an edge WHERE
-- resolved_at IS NULL, so resolving twice counts once. No foreign keys, as for job_attempts: retention
-- deletes jobs in batches and must not pay a lookup per row (taskq.delete_terminal_jobs deletes the edges).
CREATE TABLE taskq.job_dependencies (
    parent_id     uuid        NOT NULL,
    child_id      uuid        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    resolved_at   timestamptz,
    parent_status text,
    PRIMARY KEY (parent_id, child_id),
    CONSTRAINT job_dependencies_not_self CHECK (parent_id <> child_id),
    CONSTRAINT job_dependencies_resolved CHECK ((resolved_at IS NULL) = (parent_status IS NULL))
) WITH (fillfactor = 50);
-- (room on each page: resolving an edge touches no indexed column, so it is a HOT update that adds no
-- index entries, which matters for a fan-out resolved in its parent's terminal transaction)
CREATE INDEX job_dependencies_child_idx ON taskq.job_dependencies (child_id);

-- The cascade, run once per parent terminal transition (the trigger below), in that transaction.
-- Iterative, not recursive: each round resolves the unresolved edges of the current frontier of parents
-- in one statement, locks their waiting children in id order (so two cascades meet the child rows in one
-- order), updates them in one statement with one event each, and makes the children it cancelled (that
-- have children of their own) the next frontier. A chain of any length costs one trigger call, never one
-- stack frame per generation. Every round after the first has one outcome, 'cancelled' (only cancelled
-- children go on), so the outcome is a scalar. The rows are found by id arrays (= ANY, primary keys), so
-- no plan can join a big fan-out against a scan of a table. The setting taskq.settling keeps the
-- children's own terminal writes (the cancels below) from firing the trigger again: this loop takes them
-- on. Statements here see edges committed by enqueues that held the parent's row lock while the parent's
-- write waited (each statement takes a fresh snapshot).
CREATE FUNCTION taskq.settle_dependents() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    frontier uuid[] := ARRAY[NEW.id];
    outcome text := NEW.status;
    failed text;
    kids uuid[];
    counts int[];
    culprits uuid[];
BEGIN
    PERFORM set_config('taskq.settling', 'on', true);
    LOOP
        failed := CASE WHEN outcome <> 'succeeded' THEN outcome END;
        WITH resolved AS (
            UPDATE taskq.job_dependencies AS d SET resolved_at = now(), parent_status = outcome
            WHERE d.parent_id = ANY(frontier) AND d.resolved_at IS NULL
            RETURNING d.child_id, d.parent_id
        ), per_child AS (
            SELECT r.child_id, count(*)::int AS n, min(r.parent_id::text)::uuid AS culprit
            FROM resolved AS r GROUP BY r.child_id
        )
        SELECT array_agg(c.child_id ORDER BY c.child_id), array_agg(c.n ORDER BY c.child_id),
               array_agg(c.culprit ORDER BY c.child_id)
        INTO kids, counts, culprits
        FROM per_child AS c;
        EXIT WHEN kids IS NULL;
        PERFORM 1 FROM taskq.jobs WHERE id = ANY(kids) AND status = 'awaiting_parents' ORDER BY id
            FOR NO KEY UPDATE;
        WITH c AS (
            SELECT * FROM unnest(kids, counts, culprits) AS t(id, n, culprit)
        ), upd AS (
            UPDATE taskq.jobs AS j SET
                revision = j.revision + 1,
                parents_remaining = greatest(j.parents_remaining - c.n, 0),
                status = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success' THEN 'cancelled'
                              WHEN j.parents_remaining - c.n > 0 THEN 'awaiting_parents'
                              WHEN j.scheduled_at > now() THEN 'scheduled'
                              ELSE 'pending' END,
                cancel_requested_at = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success'
                                           THEN now() ELSE j.cancel_requested_at END,
                cancel_reason = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success'
                                     THEN 'parent-failure:' || failed ELSE j.cancel_reason END,
                error_class = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success'
                                   THEN 'ParentFailed' ELSE j.error_class END,
                error_message = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success'
                                     THEN format('parent %s ended %s', c.culprit, failed) ELSE j.error_message END,
                finished_at = CASE WHEN failed IS NOT NULL AND j.dependency_mode = 'on_success'
                                   THEN now() ELSE j.finished_at END
            FROM c
            WHERE j.id = c.id AND j.status = 'awaiting_parents'
            RETURNING j.id, j.status, j.queue, j.attempt, j.has_dependents, c.culprit
        ), ev AS (
            INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
            SELECT u.id, 'state_change', 'awaiting_parents', u.status, u.attempt,
                   CASE WHEN u.status = 'cancelled'
                        THEN jsonb_build_object('cause', 'parent-failure:' || failed, 'parent_id', u.culprit,
                                                'error_class', 'ParentFailed')
                        ELSE jsonb_build_object('cause', 'parents-settled') END
            FROM upd AS u WHERE u.status <> 'awaiting_parents'
        ), notified AS (
            SELECT pg_notify('taskq_jobs', q.queue)
            FROM (SELECT DISTINCT u.queue FROM upd AS u WHERE u.status = 'pending') AS q
        )
        SELECT array_agg(u.id) FILTER (WHERE u.status = 'cancelled' AND u.has_dependents)
        INTO frontier
        FROM upd AS u
        WHERE (SELECT count(*) FROM notified) >= 0;
        EXIT WHEN frontier IS NULL;
        outcome := 'cancelled';
    END LOOP;
    PERFORM set_config('taskq.settling', '', true);
    RETURN NULL;
END $$;

-- The one place every terminal write passes (the batched finish, retries exhausted, deadlines, the
-- operator's cancels, cooperative and forced cancel, abandon, the sweeper's and the supervisor's reclaim,
-- shutdown's cancelled verdict): a transition into a terminal status of a row some child depends on.
-- The WHEN is evaluated without calling the function, so other rows pay one boolean test.
CREATE TRIGGER jobs_settle_dependents AFTER UPDATE OF status ON taskq.jobs FOR EACH ROW
    WHEN (NEW.has_dependents
          AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND current_setting('taskq.settling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION taskq.settle_dependents();

-- Retention never deletes a parent that a non-terminal child still depends on, and takes the edges of
-- the jobs it deletes with them. (Replaces migration 5's function; same signature and grants.)
CREATE OR REPLACE FUNCTION taskq.delete_terminal_jobs(p_ids uuid[], OUT jobs bigint, OUT events bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.jobs AS j
        WHERE j.id = ANY(p_ids) AND j.status IN ('succeeded', 'cancelled', 'failed', 'crashed', 'abandoned')
          AND NOT (j.has_dependents AND EXISTS (
              SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c ON c.id = d.child_id
              WHERE d.parent_id = j.id
                AND c.status NOT IN ('succeeded', 'cancelled', 'failed', 'crashed', 'abandoned')))
        RETURNING j.id
    ), ev AS (
        DELETE FROM taskq.job_events AS e USING gone AS g WHERE e.job_id = g.id
        RETURNING 1
    ), edges AS (
        DELETE FROM taskq.job_dependencies AS d USING gone AS g WHERE d.child_id = g.id OR d.parent_id = g.id
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM ev)
$$;

-- requeue(..., cascade=True), after the parents' own requeue in the same transaction: the children the
-- cascade cancelled (ParentFailed) because of these jobs go back to awaiting_parents, with the edges of
-- their parents that are no longer terminal unresolved again and the count recomputed, and so on down the
-- graph (one round per generation, iteratively). A child that still has another parent in a failure
-- status stays cancelled: it would be cancelled again at once. Each revival is a requeue of the child
-- (requeue_count + 1, a 'requeued' event). Returns the ids revived.
CREATE FUNCTION taskq.revive_dependents(p_ids uuid[], p_reason text) RETURNS SETOF uuid
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    frontier uuid[] := p_ids;
BEGIN
    WHILE cardinality(frontier) > 0 LOOP
        WITH cand AS (
            SELECT c.id FROM taskq.jobs AS c
            WHERE c.id IN (SELECT d.child_id FROM taskq.job_dependencies AS d WHERE d.parent_id = ANY(frontier))
              AND c.status = 'cancelled' AND c.error_class = 'ParentFailed'
            ORDER BY c.id
            FOR NO KEY UPDATE
        ), verdict AS (
            SELECT d.child_id,
                   count(*) FILTER (WHERE p.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed',
                                                           'abandoned'))::int AS remaining,
                   coalesce(bool_or(p.status IN ('failed', 'cancelled', 'crashed', 'abandoned')), false) AS failing
            FROM taskq.job_dependencies AS d JOIN cand ON cand.id = d.child_id
            LEFT JOIN taskq.jobs AS p ON p.id = d.parent_id
            GROUP BY d.child_id
        ), upd AS (
            UPDATE taskq.jobs AS j SET
                revision = j.revision + 1, status = 'awaiting_parents', parents_remaining = v.remaining,
                requeue_count = j.requeue_count + 1,
                finished_at = NULL, cancel_phase = 0, cancel_requested_at = NULL, cancel_reason = NULL,
                error_class = NULL, error_message = NULL
            FROM verdict AS v
            WHERE j.id = v.child_id AND NOT v.failing AND v.remaining > 0
            RETURNING j.id, j.attempt, j.claim_epoch, j.requeue_count
        ), unresolve AS (
            UPDATE taskq.job_dependencies AS d SET resolved_at = NULL, parent_status = NULL
            FROM upd AS u, taskq.jobs AS p
            WHERE d.child_id = u.id AND p.id = d.parent_id
              AND p.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
        ), ev AS (
            INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
            SELECT u.id, 'requeued', 'cancelled', 'awaiting_parents', u.attempt,
                   jsonb_strip_nulls(jsonb_build_object(
                       'reason', p_reason, 'origin', 'operator', 'cause', 'parent-requeued',
                       'claim_epoch', u.claim_epoch, 'requeue_count', u.requeue_count,
                       'error_class', 'ParentFailed'))
            FROM upd AS u
        )
        SELECT coalesce(array_agg(u.id), '{}') INTO frontier FROM upd AS u;
        RETURN QUERY SELECT unnest(frontier);
    END LOOP;
END $$;
REVOKE ALL ON FUNCTION taskq.revive_dependents(uuid[], text) FROM PUBLIC;
