-- Job dependencies (taskq.backend.dependencies, taskq.backend.workers's resolver). Parameters are psycopg %(name)s.

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
                            scheduled_at, schedule_to_close, parent_id, workflow_id, idempotent, trace_context, concurrency_key,
                            fairness_key, fair_tag, parents_remaining, dependency_mode,
                            cancel_requested_at, cancel_reason, error_class, error_message, finished_at)
    SELECT u.id, %(actor)s::text, %(queue)s::text, u.payload::jsonb, d.status,
           %(priority)s::int, %(tags)s::text[], %(max_attempts)s::int,
           greatest(coalesce(%(scheduled_at)s::timestamptz, now()), now()),
           now() + %(schedule_to_close)s::float8 * interval '1 second', %(parent_id)s::uuid, %(workflow_id)s::uuid,
           %(idempotent)s::boolean, %(trace_context)s::jsonb, %(concurrency_key)s::text,
           %(fairness_key)s::text, fair.base + u.ord * fair.step,
           d.remaining, %(dependency_mode)s::text,
           CASE WHEN d.status = 'cancelled' THEN now() END,
           CASE WHEN d.status = 'cancelled' THEN 'parent-failure:' || d.failed END,
           CASE WHEN d.status = 'cancelled' THEN 'ParentFailed' END,
           CASE WHEN d.status = 'cancelled' THEN format('parent %%s ended %%s', d.failed_parent, d.failed) END,
           CASE WHEN d.status = 'cancelled' THEN now() END
    FROM decided AS d CROSS JOIN unnest(%(ids)b::uuid[], %(payloads)b::text[]) WITH ORDINALITY AS u(id, payload, ord)
    -- a fair queue's tag, from the enqueue (sql/0016_fair_claims.sql): released, the job goes first of its key
    LEFT JOIN LATERAL (
        SELECT b.base, b.step
        FROM taskq.fair_bases_v16(%(queue)s::text, ARRAY[coalesce(%(fairness_key)s::text, '')], %(priority)s::int,
                                  coalesce(%(scheduled_at)s::timestamptz <= now(), true)) AS b
        WHERE %(fairness_key)s::text IS NOT NULL
           OR EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = %(queue)s::text)
    ) AS fair ON true
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

-- name: dependency_settle_backlog
-- The resolver's step: up to `slices` slices of the dependency backlog that no other step holds, each at
-- most one chunk (taskq.settle_chunk()) of a parent's unresolved edges, settled in this transaction and
-- deleted (taskq.settle_backlog, migration 11). Returns the slices taken.
SELECT taskq.settle_backlog(%(slices)s);
