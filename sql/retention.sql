-- Retention (taskq.backend.retention): bounded batches that delete finished jobs, attempts, receipts and audit. Parameters are psycopg %(name)s.

-- name: prune_succeeded
-- Retention, one bounded batch of the succeeded class (succeeded and cancelled): the oldest finished rows
-- past the keep window, read in finished_at order from jobs_retention_succeeded_idx and deleted with their
-- events by taskq.delete_terminal_jobs (which deletes nothing that is not terminal). SKIP LOCKED: a row
-- some transaction holds (a requeue, a cancel) is left for the next round, and the lock keeps the row
-- terminal until the delete. The gate, a transaction-level advisory lock tried once per batch (so it
-- works behind transaction poolers) and held through the pause after it (prune_pause), lets one pruner
-- at a time work across the fleet: one that finds the gate taken ends its round (an empty batch) and
-- comes back at its next interval. A parent that a non-terminal child still depends on is passed over
-- (delete_terminal_jobs would keep it too, but the batch would then keep choosing it).
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.jobs, gate
    WHERE gate.open
      AND status IN ('succeeded', 'cancelled') AND finished_at < now() - %(keep)s::float8 * interval '1 second'
      AND NOT (has_dependents AND EXISTS (SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c
                                          ON c.id = d.child_id WHERE d.parent_id = jobs.id
                                          AND c.status IN ('pending', 'scheduled', 'running', 'awaiting_parents')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE OF jobs SKIP LOCKED
)
SELECT d.jobs, d.events FROM taskq.delete_terminal_jobs_v17(ARRAY(SELECT id FROM doomed)) AS d;

-- name: prune_failed
-- As prune_succeeded, for the failed class (failed, crashed, abandoned), from jobs_retention_failed_idx.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.jobs, gate
    WHERE gate.open AND status IN ('failed', 'crashed', 'abandoned')
      AND finished_at < now() - %(keep)s::float8 * interval '1 second'
      AND NOT (has_dependents AND EXISTS (SELECT 1 FROM taskq.job_dependencies AS d JOIN taskq.jobs AS c
                                          ON c.id = d.child_id WHERE d.parent_id = jobs.id
                                          AND c.status IN ('pending', 'scheduled', 'running', 'awaiting_parents')))
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE OF jobs SKIP LOCKED
)
SELECT d.jobs, d.events FROM taskq.delete_terminal_jobs_v17(ARRAY(SELECT id FROM doomed)) AS d;

-- name: prune_attempts
-- One bounded batch of finished attempts rows past their own keep window. They outlive their jobs; an open
-- attempt (finished_at NULL) is never pruned. Read oldest start first from job_attempts_retention_idx, on
-- started_at (schema 23: an index on finished_at would make every finish a non-HOT update): an attempt that
-- finished before the cutoff started before it. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT job_id, claim_epoch FROM taskq.job_attempts, gate
    WHERE gate.open AND started_at < now() - %(keep)s::float8 * interval '1 second'
      AND finished_at IS NOT NULL AND finished_at < now() - %(keep)s::float8 * interval '1 second'
    ORDER BY started_at
    LIMIT %(limit)s
    FOR UPDATE OF job_attempts SKIP LOCKED
)
SELECT d.attempts, 0::bigint AS events
FROM taskq.delete_finished_attempts(ARRAY(SELECT job_id FROM doomed), ARRAY(SELECT claim_epoch FROM doomed)) AS d;

-- name: prune_receipts
-- One bounded batch of the web API's idempotency receipts past their keep window (`retention_receipts`),
-- oldest first from operator_requests_created_idx, deleted by the owner function (the worker role has no
-- DELETE on the table). No row lock (the worker role may not take one here, and needs none): a receipt
-- that a new request takes over past the 24 h window (receipt_claim) gets created_at = now(), and the
-- function's delete, waiting on that row, re-checks its age and leaves it. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT principal, key FROM taskq.operator_requests, gate
    WHERE gate.open AND created_at < now() - %(keep)s::float8 * interval '1 second'
    ORDER BY created_at
    LIMIT %(limit)s
)
SELECT taskq.delete_operator_requests(ARRAY(SELECT principal FROM doomed), ARRAY(SELECT key FROM doomed),
                                      %(keep)s::float8) AS rows, 0::bigint AS events;

-- name: prune_audit
-- One bounded batch of operator audit rows past their keep window (`retention_audit`), oldest first from
-- operator_audit_at_idx, deleted by the owner function. A window under an hour counts as an hour (the
-- function's floor too). Audit rows are never updated: no row lock. Same gate.
WITH gate AS (
    SELECT pg_try_advisory_xact_lock(7461732, 1) AS open
), doomed AS (
    SELECT id FROM taskq.operator_audit, gate
    WHERE gate.open AND at < now() - greatest(%(keep)s::float8, 3600) * interval '1 second'
    ORDER BY at
    LIMIT %(limit)s
)
SELECT taskq.delete_operator_audit(ARRAY(SELECT id FROM doomed), %(keep)s::float8) AS rows, 0::bigint AS events;

-- name: prune_pause
-- The pause after a prune batch, taken holding the batch gate: while one pruner pauses, a batch of any
-- other pruner finds the gate taken and ends its round, so the fleet as a whole prunes at one pruner's
-- pace however many workers run one. A pruner that finds the gate taken here returns at once (its next
-- batch will find it taken too). A transaction of its own that holds no row lock.
SELECT pg_sleep(%(seconds)s::float8) FROM (SELECT pg_try_advisory_xact_lock(7461732, 1) AS got) AS g WHERE g.got;

-- name: prune_count
-- `taskq prune --dry-run`: what a prune would delete now, per class, without deleting (a window of 0
-- disables its class). The same index-backed predicates as the batches.
WITH succ AS (
    SELECT id FROM taskq.jobs
    WHERE %(keep_succeeded)s::float8 > 0 AND status IN ('succeeded', 'cancelled')
      AND finished_at < now() - %(keep_succeeded)s::float8 * interval '1 second'
), fail AS (
    SELECT id FROM taskq.jobs
    WHERE %(keep_failed)s::float8 > 0 AND status IN ('failed', 'crashed', 'abandoned')
      AND finished_at < now() - %(keep_failed)s::float8 * interval '1 second'
)
SELECT (SELECT count(*) FROM succ) AS succeeded,
       (SELECT count(*) FROM fail) AS failed,
       (SELECT count(*) FROM taskq.job_attempts
        WHERE %(keep_attempts)s::float8 > 0 AND started_at < now() - %(keep_attempts)s::float8 * interval '1 second'
          AND finished_at IS NOT NULL
          AND finished_at < now() - %(keep_attempts)s::float8 * interval '1 second') AS attempts,
       (SELECT count(*) FROM taskq.operator_requests
        WHERE %(keep_receipts)s::float8 > 0
          AND created_at < now() - %(keep_receipts)s::float8 * interval '1 second') AS receipts,
       (SELECT count(*) FROM taskq.operator_audit
        WHERE %(keep_audit)s::float8 > 0
          AND at < now() - greatest(%(keep_audit)s::float8, 3600) * interval '1 second') AS audit,
       (SELECT count(*) FROM taskq.job_events AS e
        WHERE e.job_id IN (SELECT id FROM succ UNION ALL SELECT id FROM fail)) AS events;
