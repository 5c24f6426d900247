-- taskq schema: job dependencies, settled per statement and in bounded chunks.
--
-- Migration 9 settled a parent's dependents from a row trigger, all of them, in the parent's terminal
-- transaction. Two costs followed: a finish batch of k parents of one child updated that child k times
-- (once per row), and one parent of 10,000 children held its terminal transaction for all 10,000.
-- This migration replaces that trigger with:
--   - a settle per statement (a row trigger notes the parents going terminal, a statement trigger settles
--     them together), so a finish batch settles each child once, whatever number of its parents it ended;
--   - a budget of edges per transaction (taskq.settle_chunk(), 500 unless the setting
--     taskq.settle_chunk says otherwise): the parent's terminal transaction settles at most that many,
--     and writes what it left, cut into slices of at most one chunk (a parent and a range of child
--     ids), to taskq.dependency_backlog, in the same transaction;
--   - taskq.settle_backlog(), which every worker's resolver calls (woken by NOTIFY taskq_settle, or its
--     poll): it takes one slice nobody else holds (SKIP LOCKED), settles it in its own transaction, and
--     deletes it. Slices of one parent are settled in parallel by as many steps as run.
-- Correctness does not depend on who settles an edge: an edge is resolved only WHERE resolved_at IS NULL
-- (resolving twice counts once), a child's count is lowered by the edges a statement actually resolved,
-- and a backlog row is deleted only in a transaction that found its parent with no unresolved edge (so a
-- crash, which rolls back, leaves the row for any later resolver, or the next worker's start).

-- A slice: the unresolved edges of parent_id to children with lo <= child_id < hi (NULL: unbounded). The
-- slices written for a parent cover every child id, so no edge is outside them; two slices may overlap
-- (a step out of budget cuts what is left of its own slice again), which costs a look, never a count.
CREATE TABLE taskq.dependency_backlog (
    id        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    parent_id uuid        NOT NULL,
    lo        uuid,
    hi        uuid,
    queued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX dependency_backlog_parent_idx ON taskq.dependency_backlog (parent_id);

-- The edges one transaction may settle (tests and operators can lower or raise it per role or database).
CREATE FUNCTION taskq.settle_chunk() RETURNS integer
    LANGUAGE sql STABLE SET search_path = pg_catalog AS $$
    SELECT greatest(coalesce(nullif(current_setting('taskq.settle_chunk', true), '')::integer, 500), 1)
$$;

-- The cascade over a frontier of terminal parents (p_parents with their statuses), within p_budget edges.
-- Iterative, one round per generation, as in migration 9: each round resolves up to the remaining budget of
-- the frontier's unresolved edges in one statement, locks their waiting children in id order, updates
-- each child once (its count lowered by the edges resolved for it; in on_success mode cancelled when one of
-- them records a failure), with one event each, and makes the cancelled children with children of their
-- own the next frontier. When the budget runs out, what is left of the current frontier and all of the next
-- go to the backlog, in slices of at most p_budget edges, and a NOTIFY wakes the resolvers.
-- taskq.settling keeps the children's own writes from firing the trigger again. Returns the edges resolved.
-- p_lo, p_hi: the first round takes only the edges to children in [p_lo, p_hi) (a resolver's slice).
CREATE FUNCTION taskq.settle_frontier(p_parents uuid[], p_statuses text[], p_budget integer,
                                      p_lo uuid DEFAULT NULL, p_hi uuid DEFAULT NULL) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    lo uuid := p_lo;
    hi uuid := p_hi;
    frontier uuid[] := p_parents;
    statuses text[] := p_statuses;
    budget integer := p_budget;
    total integer := 0;
    done integer;
    kids uuid[];
    counts integer[];
    culprits uuid[];
    faileds text[];
    was text := coalesce(current_setting('taskq.settling', true), '');
BEGIN
    PERFORM set_config('taskq.settling', 'on', true);
    LOOP
        WITH f AS (
            SELECT * FROM unnest(frontier, statuses) AS t(id, status)
        ), pick AS (
            SELECT e.parent_id, e.child_id FROM taskq.job_dependencies AS e
            WHERE e.parent_id = ANY(frontier) AND e.resolved_at IS NULL
              AND (lo IS NULL OR e.child_id >= lo) AND (hi IS NULL OR e.child_id < hi)
            ORDER BY e.parent_id, e.child_id
            LIMIT budget
        ), resolved AS (
            UPDATE taskq.job_dependencies AS d SET resolved_at = now(), parent_status = f.status
            FROM pick, f
            WHERE d.parent_id = pick.parent_id AND d.child_id = pick.child_id AND f.id = d.parent_id
              AND d.resolved_at IS NULL
            RETURNING d.child_id, d.parent_id, d.parent_status
        ), per_child AS (
            SELECT r.child_id, count(*)::int AS n,
                   (array_agg(r.parent_id ORDER BY r.parent_id) FILTER (WHERE r.parent_status <> 'succeeded'))[1]
                       AS culprit,
                   (array_agg(r.parent_status ORDER BY r.parent_id) FILTER (WHERE r.parent_status <> 'succeeded'))[1]
                       AS failed
            FROM resolved AS r GROUP BY r.child_id
        )
        SELECT array_agg(c.child_id ORDER BY c.child_id), array_agg(c.n ORDER BY c.child_id),
               array_agg(c.culprit ORDER BY c.child_id), array_agg(c.failed ORDER BY c.child_id)
        INTO kids, counts, culprits, faileds
        FROM per_child AS c;
        EXIT WHEN kids IS NULL;
        SELECT sum(x) INTO done FROM unnest(counts) AS x;
        total := total + done;
        budget := budget - done;
        PERFORM 1 FROM taskq.jobs WHERE id = ANY(kids) AND status = 'awaiting_parents' ORDER BY id
            FOR NO KEY UPDATE;
        WITH c AS (
            SELECT t.*, (t.failed IS NOT NULL) AS failing FROM unnest(kids, counts, culprits, faileds)
                AS t(id, n, culprit, failed)
        ), upd AS (
            UPDATE taskq.jobs AS j SET
                revision = j.revision + 1,
                parents_remaining = greatest(j.parents_remaining - c.n, 0),
                status = CASE WHEN c.failing AND j.dependency_mode = 'on_success' THEN 'cancelled'
                              WHEN j.parents_remaining - c.n > 0 THEN 'awaiting_parents'
                              WHEN j.scheduled_at > now() THEN 'scheduled'
                              ELSE 'pending' END,
                cancel_requested_at = CASE WHEN c.failing AND j.dependency_mode = 'on_success'
                                           THEN now() ELSE j.cancel_requested_at END,
                cancel_reason = CASE WHEN c.failing AND j.dependency_mode = 'on_success'
                                     THEN 'parent-failure:' || c.failed ELSE j.cancel_reason END,
                error_class = CASE WHEN c.failing AND j.dependency_mode = 'on_success'
                                   THEN 'ParentFailed' ELSE j.error_class END,
                error_message = CASE WHEN c.failing AND j.dependency_mode = 'on_success'
                                     THEN format('parent %s ended %s', c.culprit, c.failed) ELSE j.error_message END,
                finished_at = CASE WHEN c.failing AND j.dependency_mode = 'on_success'
                                   THEN now() ELSE j.finished_at END
            FROM c
            WHERE j.id = c.id AND j.id = ANY(kids) AND j.status = 'awaiting_parents'
            RETURNING j.id, j.status, j.queue, j.attempt, j.has_dependents, c.culprit, c.failed
        ), ev AS (
            INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, detail)
            SELECT u.id, 'state_change', 'awaiting_parents', u.status, u.attempt,
                   CASE WHEN u.status = 'cancelled'
                        THEN jsonb_build_object('cause', 'parent-failure:' || u.failed, 'parent_id', u.culprit,
                                                'error_class', 'ParentFailed')
                        ELSE jsonb_build_object('cause', 'parents-settled') END
            FROM upd AS u WHERE u.status <> 'awaiting_parents'
        ), notified AS (
            SELECT pg_notify('taskq_jobs', q.queue)
            FROM (SELECT DISTINCT u.queue FROM upd AS u WHERE u.status = 'pending') AS q
        ), nxt AS (
            SELECT array_agg(u.id ORDER BY u.id) FILTER (WHERE u.status = 'cancelled' AND u.has_dependents) AS ids
            FROM upd AS u
            WHERE (SELECT count(*) FROM notified) >= 0
        )
        SELECT nxt.ids INTO kids FROM nxt;
        IF budget <= 0 THEN
            -- out of budget: what is left of this frontier (in this round's range) and all of the next one go
            -- to the resolvers, in slices of at most one chunk that cover every child id of their parent
            WITH u AS (
                SELECT e.parent_id, e.child_id,
                       row_number() OVER (PARTITION BY e.parent_id ORDER BY e.child_id) AS rn
                FROM taskq.job_dependencies AS e
                WHERE e.parent_id = ANY(frontier) AND e.resolved_at IS NULL
                  AND (lo IS NULL OR e.child_id >= lo) AND (hi IS NULL OR e.child_id < hi)
            ), cut AS (
                SELECT u.parent_id, u.child_id, u.rn FROM u WHERE (u.rn - 1) % p_budget = 0
            ), left_here AS (
                SELECT c.parent_id, CASE WHEN c.rn = 1 THEN lo ELSE c.child_id END AS lo,
                       coalesce(lead(c.child_id) OVER (PARTITION BY c.parent_id ORDER BY c.child_id), hi) AS hi
                FROM cut AS c
            )
            INSERT INTO taskq.dependency_backlog (parent_id, lo, hi)
            SELECT l.parent_id, l.lo, l.hi FROM left_here AS l
            UNION ALL
            SELECT x, NULL, NULL FROM unnest(kids) AS x;
            PERFORM pg_notify('taskq_settle', '');
            EXIT;
        END IF;
        frontier := kids;
        EXIT WHEN frontier IS NULL;
        lo := NULL;
        hi := NULL;
        statuses := array_fill('cancelled'::text, ARRAY[cardinality(frontier)]);
    END LOOP;
    PERFORM set_config('taskq.settling', was, true);
    RETURN total;
END $$;
REVOKE ALL ON FUNCTION taskq.settle_frontier(uuid[], text[], integer, uuid, uuid) FROM PUBLIC;

-- The one place every terminal write passes (the batched finish, retries exhausted, deadlines, the
-- operator's cancels, cooperative and forced cancel, abandon, the sweeper's and the supervisor's reclaim,
-- shutdown's cancelled verdict), now once per statement, in two triggers:
--   - jobs_note_settled, BEFORE UPDATE, per row, whose WHEN is true only for a row with dependents going
--     terminal (evaluated without calling the function, so any other row pays one boolean test): it adds
--     the row's id to the transaction-local setting taskq.settle_ids;
--   - jobs_settle_dependents, AFTER UPDATE, per statement, whose WHEN (evaluated at the statement's end,
--     after every row's BEFORE trigger) is true only when that setting holds ids: it takes them, reads
--     their status, and settles them as one frontier.
-- A statement that ends no parent pays the two WHEN tests and no function call.
CREATE FUNCTION taskq.note_settled() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM set_config('taskq.settle_ids',
                       coalesce(nullif(current_setting('taskq.settle_ids', true), '') || ',', '') || NEW.id::text,
                       true);
    RETURN NEW;
END $$;

CREATE FUNCTION taskq.settle_dependents_stmt() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    noted uuid[] := string_to_array(current_setting('taskq.settle_ids', true), ',')::uuid[];
    ids uuid[];
    sts text[];
BEGIN
    PERFORM set_config('taskq.settle_ids', '', true);
    SELECT array_agg(j.id ORDER BY j.id), array_agg(j.status ORDER BY j.id) INTO ids, sts
    FROM taskq.jobs AS j
    WHERE j.id = ANY(noted) AND j.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned');
    IF ids IS NOT NULL THEN
        PERFORM taskq.settle_frontier(ids, sts, taskq.settle_chunk());
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER jobs_settle_dependents ON taskq.jobs;
DROP FUNCTION taskq.settle_dependents();
CREATE TRIGGER jobs_note_settled BEFORE UPDATE OF status ON taskq.jobs FOR EACH ROW
    WHEN (NEW.has_dependents
          AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND current_setting('taskq.settling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION taskq.note_settled();
CREATE TRIGGER jobs_settle_dependents AFTER UPDATE ON taskq.jobs FOR EACH STATEMENT
    WHEN (coalesce(current_setting('taskq.settle_ids', true), '') <> '')
    EXECUTE FUNCTION taskq.settle_dependents_stmt();

-- The resolver's step (every worker runs one, or several at once): one backlog slice no other step holds,
-- its parent's status read under a share lock (a requeue of it waits for this transaction, so no edge is
-- resolved with a status the parent no longer has), the slice settled (one chunk at most; the cascade below
-- it within the same budget), and the slice deleted (what a step out of budget leaves is sliced again),
-- committed without waiting for its WAL flush (see below). A parent no longer terminal: its slice is
-- dropped (its next terminal write settles it). Returns the slices taken (0: none left, or all held).
CREATE FUNCTION taskq.settle_backlog(p_slices integer) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    slice record;
    taken integer := 0;
    st text;
BEGIN
    -- A step needs no WAL flush of its own at commit: should the server crash before it is flushed, the
    -- step is lost whole (its edges, children and the slice's delete), so its slice is still there and a
    -- later step does it again. Anything that saw its effects and committed (a claim of a released child)
    -- flushed the WAL up to its own commit, which is after this one.
    PERFORM set_config('synchronous_commit', 'off', true);
    FOR slice IN
        SELECT b.id, b.parent_id, b.lo, b.hi FROM taskq.dependency_backlog AS b
        ORDER BY b.queued_at, b.id LIMIT p_slices
        FOR UPDATE SKIP LOCKED
    LOOP
        taken := taken + 1;
        SELECT j.status INTO st FROM taskq.jobs AS j
        WHERE j.id = slice.parent_id AND j.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
        FOR SHARE;
        IF st IS NOT NULL THEN
            PERFORM taskq.settle_frontier(ARRAY[slice.parent_id], ARRAY[st], taskq.settle_chunk(), slice.lo, slice.hi);
        END IF;
        DELETE FROM taskq.dependency_backlog WHERE id = slice.id;
    END LOOP;
    RETURN taken;
END $$;
REVOKE ALL ON FUNCTION taskq.settle_backlog(integer) FROM PUBLIC;

-- Retention: a backlog row of a parent it deletes goes with it (the parent's edges go too).
CREATE OR REPLACE FUNCTION taskq.delete_terminal_jobs(p_ids uuid[], OUT jobs bigint, OUT events bigint)
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
    )
    SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM ev)
$$;
