-- `taskq bench` (taskq.ops.bench, taskq.backend.bench): what it reads of the server and of its own rows,
-- and the deletes that leave the database as the run found it. Every statement names the run's queue, its job
-- ids or its worker ids: no other row is read for a figure or deleted.

-- name: bench_server
SELECT current_setting('server_version') AS server_version,
       current_setting('synchronous_commit') AS synchronous_commit,
       ARRAY(SELECT t FROM unnest(%(tables)s::text[]) AS t WHERE NOT has_table_privilege(t, 'DELETE'))
           AS cannot_delete

-- name: bench_unfinished
-- two counts, each over the partial index that holds those statuses with the queue as its first column
-- (jobs_claim_idx, jobs_running_scope_idx), as taskq.queue_depth_v19 does
SELECT (SELECT count(*) FROM taskq.jobs WHERE queue = %(queue)s AND status IN ('pending', 'scheduled'))
     + (SELECT count(*) FROM taskq.jobs WHERE queue = %(queue)s AND status = 'running') AS unfinished

-- name: bench_span
SELECT count(*) AS jobs, count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       extract(epoch FROM max(finished_at) - min(started_at))::float8 AS seconds
FROM taskq.jobs
WHERE id BETWEEN %(lo)s AND %(hi)s AND queue = %(queue)s

-- name: bench_pickup
-- created_at is the insert's now(), started_at the claim's: both the server's clock
SELECT count(*) AS found, count(*) FILTER (WHERE started_at IS NULL) AS waiting,
       coalesce(array_agg(extract(epoch FROM started_at - created_at)::float8 ORDER BY id)
                    FILTER (WHERE started_at IS NOT NULL), '{}') AS latencies
FROM taskq.jobs
WHERE id = ANY(%(ids)s::uuid[])

-- name: bench_delete_jobs
-- One bounded batch of the run's jobs, in id order from `after`, with every row keyed by their ids. The ids go
-- to the other deletes as one array (an InitPlan), so each is an index scan of its job_id index. Lease losses
-- are the workers' rows, deleted with them (DELETE_WORKERS).
WITH gone AS (
    DELETE FROM taskq.jobs AS j
    WHERE j.id IN (SELECT id FROM taskq.jobs
                   WHERE id > %(after)s AND id <= %(hi)s AND queue = %(queue)s
                   ORDER BY id LIMIT %(limit)s)
    RETURNING j.id
), doomed AS MATERIALIZED (
    SELECT coalesce(array_agg(id ORDER BY id), '{}') AS ids FROM gone
), events AS (
    DELETE FROM taskq.job_events WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), attempts AS (
    DELETE FROM taskq.job_attempts WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), steps AS (
    DELETE FROM taskq.job_steps WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), signals AS (
    DELETE FROM taskq.job_signals WHERE job_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
), edges AS (
    DELETE FROM taskq.job_dependencies
    WHERE parent_id = ANY((SELECT ids FROM doomed)::uuid[]) OR child_id = ANY((SELECT ids FROM doomed)::uuid[])
    RETURNING 1
), backlog AS (
    DELETE FROM taskq.dependency_backlog WHERE parent_id = ANY((SELECT ids FROM doomed)::uuid[]) RETURNING 1
)
SELECT cardinality(d.ids) AS jobs, d.ids[cardinality(d.ids)] AS last,
       (SELECT count(*) FROM events) AS events, (SELECT count(*) FROM attempts) AS attempts,
       (SELECT count(*) FROM steps) + (SELECT count(*) FROM signals) + (SELECT count(*) FROM edges)
           + (SELECT count(*) FROM backlog) AS other
FROM doomed AS d

-- name: bench_delete_workers
-- The queue's row is the one its first worker registered (worker_register); queue_events has rows only if
-- someone paused or limited the run's queue meanwhile.
WITH workers AS (
    DELETE FROM taskq.workers WHERE id = ANY(%(workers)s::text[]) RETURNING 1
), losses AS (
    DELETE FROM taskq.lease_losses WHERE worker_id = ANY(%(workers)s::text[]) RETURNING 1
), queue AS (
    DELETE FROM taskq.queues WHERE name = %(queue)s RETURNING 1
), queue_events AS (
    DELETE FROM taskq.queue_events WHERE queue = %(queue)s RETURNING 1
)
SELECT (SELECT count(*) FROM workers) AS workers, (SELECT count(*) FROM losses) AS losses,
       (SELECT count(*) FROM queue) + (SELECT count(*) FROM queue_events) AS queue
