-- Queries of the HTTP operator API and dashboard (taskq.backend_web). Parameters are psycopg %(name)s.
-- Every read of jobs here is index-backed (tests/integration/test_web_plans.py checks each with EXPLAIN);
-- the list queries are sent unprepared, so each gets a plan for its own filters.

-- ---- tokens ----------------------------------------------------------------------------------------

-- name: token_insert
-- Through the owner function (the admin role): it checks the grants, sets created_by to session_user and
-- writes the tokens:create audit row. No row when the name is taken.
SELECT name, grants, created_at, created_by, last_used_at, revoked_at
FROM taskq.token_create_v18(%(name)s, %(token_hash)s, %(grants)s::text[], %(os_user)s);

-- name: token_list
SELECT name, grants, created_at, created_by, last_used_at, revoked_at FROM taskq.api_tokens ORDER BY name;

-- name: token_revoke
-- Through the owner function (the admin role): revoked_at is written once, the token's dashboard sessions
-- end, a tokens:revoke audit row is written. `changed` is false for a token already revoked; no row for an
-- unknown name.
SELECT name, changed FROM taskq.token_revoke_v15(%(name)s, %(os_user)s);

-- name: token_lookup
-- The live token with this hash, stamping last_used_at at most once a minute.
WITH t AS (
    SELECT name, grants, last_used_at FROM taskq.api_tokens
    WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
), touch AS (
    UPDATE taskq.api_tokens AS a SET last_used_at = now()
    FROM t WHERE a.name = t.name AND (t.last_used_at IS NULL OR t.last_used_at < now() - interval '1 minute')
)
SELECT name, grants FROM t;

-- ---- idempotency receipts and audit -------------------------------------------------------------------

-- name: receipt_claim
-- First statement of an action's transaction: a duplicate of a request in flight waits here on the
-- primary key until the first commits (then replays) or rolls back (then runs). A key is honoured for
-- 24 hours from its first request: an older receipt, not yet pruned (retention_receipts), is taken over
-- by the new request, so a replay after the window is a new request whenever the pruner last ran.
INSERT INTO taskq.operator_requests AS r (principal, key, fingerprint)
VALUES (%(principal)s, %(key)s, %(fingerprint)s)
ON CONFLICT (principal, key) DO UPDATE
    SET fingerprint = EXCLUDED.fingerprint, status = NULL, body = NULL, created_at = now()
    WHERE r.created_at < now() - interval '24 hours'
RETURNING key;

-- name: receipt_get
SELECT fingerprint, status, body FROM taskq.operator_requests WHERE principal = %(principal)s AND key = %(key)s;

-- name: receipt_store
UPDATE taskq.operator_requests SET status = %(status)s, body = %(body)s::jsonb
WHERE principal = %(principal)s AND key = %(key)s;

-- name: audit_insert
-- One audit row per job touched (or one with no job, for a schedule or a queue), and for each job one
-- 'operator' event on its timeline, in the caller's transaction, through the owner function (the web
-- role): it refuses an unknown action or outcome, a principal that is not a live token (or anonymous) and
-- a job that is not in the queue given, and folds a refused write repeated within 60 s into its row.
SELECT taskq.audit_write_v18(%(principal)s, %(action)s, %(schedule)s, %(reason)s, %(request_id)s,
                             %(idempotency_key)s, %(expected_revision)s, %(detail)s::jsonb, %(job_ids)s::uuid[],
                             %(queues)s::text[], %(revisions)s::bigint[], %(outcomes)s::text[]) AS written;

-- name: audit_session
-- One audit row for a CLI write (the client role): the principal is 'db:' || session_user, set by the
-- database.
SELECT taskq.audit_session_v18(%(action)s, %(outcome)s, %(job_id)s::uuid, %(queue)s, %(schedule)s, %(reason)s,
                               %(detail)s::jsonb) AS written;

-- name: audit_for_job
-- A job's audit rows, newest first, at most %(limit)s, before the id %(before)s (NULL: from the newest),
-- from operator_audit_job_idx.
SELECT id, at, principal, action, outcome, queue, job_id, schedule, reason, request_id, idempotency_key,
       expected_revision, revision, detail, db_role, repeats, last_repeat_at
FROM taskq.operator_audit
WHERE job_id = %(id)s AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_events_page
-- A job's timeline, newest first, at most %(limit)s, before the id %(before)s (NULL: from the newest),
-- from job_events_pkey (job_id, id).
SELECT id, job_id, at, kind, from_status, to_status, attempt, worker_id, detail
FROM taskq.job_events
WHERE job_id = %(id)s AND (%(before)s::bigint IS NULL OR id < %(before)s::bigint)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: job_attempts_newest
-- A job's newest %(limit)s attempts, newest first (job_attempts_pkey).
SELECT job_id, attempt, claim_epoch, worker_id, started_at, finished_at, outcome, error_class, error_message
FROM taskq.job_attempts WHERE job_id = %(id)s
ORDER BY claim_epoch DESC
LIMIT %(limit)s;

-- ---- dashboard sessions -------------------------------------------------------------------------

-- name: session_create
INSERT INTO taskq.web_sessions (id_hash, token_name, csrf_secret, idle_expires_at, expires_at)
VALUES (%(id_hash)s, %(token_name)s, %(csrf_secret)s, now() + %(idle)s * interval '1 second',
        now() + %(absolute)s * interval '1 second')
RETURNING id_hash, token_name, csrf_secret, created_at, idle_expires_at, expires_at;

-- name: session_resolve
-- The live session with this hash and its token's grants (none once ended, expired, or its token
-- revoked), moving its idle expiry forward (written at most once per %(touch_after)s seconds).
WITH s AS (
    SELECT s.id_hash, s.token_name, s.csrf_secret, s.last_seen_at, s.expires_at, t.grants
    FROM taskq.web_sessions AS s JOIN taskq.api_tokens AS t ON t.name = s.token_name
    WHERE s.id_hash = %(id_hash)s AND s.ended_at IS NULL AND s.idle_expires_at > now() AND s.expires_at > now()
      AND t.revoked_at IS NULL
), touch AS (
    UPDATE taskq.web_sessions AS w
    SET last_seen_at = now(), idle_expires_at = least(now() + %(idle)s * interval '1 second', s.expires_at)
    FROM s WHERE w.id_hash = s.id_hash AND s.last_seen_at < now() - %(touch_after)s * interval '1 second'
)
SELECT token_name, grants, csrf_secret FROM s;

-- name: session_end
UPDATE taskq.web_sessions SET ended_at = now() WHERE id_hash = %(id_hash)s AND ended_at IS NULL
RETURNING token_name;

-- name: session_prune
-- At most %(limit)s sessions that can no longer be used (ended, idle past their expiry, or past their
-- absolute limit), deleted.
DELETE FROM taskq.web_sessions WHERE id_hash IN (
    SELECT id_hash FROM taskq.web_sessions
    WHERE ended_at IS NOT NULL OR idle_expires_at <= now() OR expires_at <= now()
    LIMIT %(limit)s
);

-- ---- jobs ------------------------------------------------------------------------------------------

-- name: job_lock
SELECT * FROM taskq.jobs WHERE id = %(id)s FOR UPDATE;

-- name: job_page
-- One page of jobs, newest first, after the keyset cursor (created_at, id) of the previous page.
-- `readable`: LIKE patterns of the queues the caller may read (NULL: all); `allowed`: those of the queues
-- it may act on, for a bulk action's selection (NULL: all, or not a bulk action). Each comes split in two
-- (taskq.backend.web.page_params): the patterns without a wildcard as names (`*_names`, compared with
-- =, which the planner estimates from the column's statistics) and the others (`*_like`). The cursor is written as
-- created_at <= X AND (created_at < X OR id < Y) so that created_at <= X is an index condition.
-- `uncancelled`: only rows without a cancel request (a bulk cancel's selection).
SELECT * FROM taskq.jobs
WHERE (%(statuses)s::text[] IS NULL OR status = ANY(%(statuses)s::text[]))
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(actors)s::text[] IS NULL OR actor = ANY(%(actors)s::text[]))
  AND (%(tags)s::text[] IS NULL OR (tags @> %(tags)s::text[] AND tags <> '{}'::text[]))
  AND (%(parent_id)s::uuid IS NULL OR parent_id = %(parent_id)s::uuid)
  AND (%(created_after)s::timestamptz IS NULL OR created_at > %(created_after)s::timestamptz)
  AND (%(created_before)s::timestamptz IS NULL OR created_at < %(created_before)s::timestamptz)
  AND (%(workflow_id)s::uuid IS NULL OR workflow_id = %(workflow_id)s::uuid)
  AND (%(waiting)s::text IS NULL OR (status = 'scheduled' AND wait_kind IS NOT NULL
                                     AND (%(waiting)s::text = 'any' OR wait_kind = %(waiting)s::text)))
  AND (%(readable)s::text[] IS NULL OR queue = ANY(%(readable_names)s::text[])
       OR queue LIKE ANY(%(readable_like)s::text[]))
  AND (%(allowed)s::text[] IS NULL OR queue = ANY(%(allowed_names)s::text[])
       OR queue LIKE ANY(%(allowed_like)s::text[]))
  AND (NOT %(uncancelled)s::boolean OR cancel_requested_at IS NULL)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at <= %(after_at)s::timestamptz
           AND (created_at < %(after_at)s::timestamptz OR id < %(after_id)s::uuid)))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: workflow_queues
-- The queues a workflow's members are in (jobs_workflow_idx), for the grant check of its cancel.
SELECT DISTINCT queue FROM taskq.jobs WHERE workflow_id = %(workflow_id)s::uuid ORDER BY queue;

-- name: workflow_members
-- A workflow's members, oldest first (jobs_workflow_idx), at most %(limit)s.
SELECT * FROM taskq.jobs WHERE workflow_id = %(workflow_id)s::uuid ORDER BY created_at, id LIMIT %(limit)s;

-- name: workflow_edges
-- The dependency edges into the workflow's members (job_dependencies_child_idx), parent -> child.
SELECT d.parent_id, d.child_id
FROM taskq.jobs AS c JOIN taskq.job_dependencies AS d ON d.child_id = c.id
WHERE c.workflow_id = %(workflow_id)s::uuid;

-- name: job_children
SELECT * FROM taskq.jobs WHERE parent_id = %(id)s ORDER BY created_at, id LIMIT %(limit)s;

-- name: jobs_cancelling
-- Every cancel in flight: running rows with a cancel request (jobs_cancel_held_idx), oldest first.
SELECT * FROM taskq.jobs
WHERE status = 'running' AND cancel_requested_at IS NOT NULL
  AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
ORDER BY cancel_requested_at, id
LIMIT %(limit)s;

-- name: job_escalated_at
-- When the cancel ladder of each job reached phase 2 (its escalation event), for the time-left clocks.
SELECT DISTINCT ON (job_id) job_id, at FROM taskq.job_events
WHERE job_id = ANY(%(ids)s::uuid[]) AND kind = 'state_change' AND (detail ->> 'cancel_phase_to') = '2'
ORDER BY job_id, id DESC;

-- ---- stats (the overview) ---------------------------------------------------------------------------

-- name: stats_depth
-- Per queue, the waiting, running and awaiting_parents rows by status, from the three partial indexes that
-- hold them (jobs_awaiting_queue_idx for the last), and the oldest waiting job. Finished rows are counted by stats_recent (the last hour), never all of them.
SELECT queue, status, count(*) AS n, min(created_at) AS oldest
FROM taskq.jobs WHERE status IN ('pending', 'scheduled')
  AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*), min(started_at)
FROM taskq.jobs WHERE status = 'running'
  AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
GROUP BY queue, status
UNION ALL
SELECT queue, status, count(*), NULL::timestamptz
FROM taskq.jobs WHERE status = 'awaiting_parents'
  AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
GROUP BY queue, status
ORDER BY 1, 2;

-- name: stats_queues
-- Each queue's pause and limits, from taskq.queues (one row per queue an operator or a limit touched).
SELECT name, paused_at, paused_by, pause_reason, concurrency_limit, concurrency_per_key, rate_limit, rate_period
FROM taskq.queues
WHERE (%(readable)s::text[] IS NULL OR name LIKE ANY(%(readable)s::text[]))
ORDER BY name;

-- name: stats_recent
-- The finished jobs of the last %(minutes)s minutes per queue, minute and status, with run time p50/p95
-- (seconds from start to finish), from the two retention indexes on finished_at.
WITH f AS (
    SELECT queue, status, finished_at, started_at FROM taskq.jobs
    WHERE status IN ('succeeded', 'cancelled') AND finished_at > now() - %(minutes)s * interval '1 minute'
      AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
    UNION ALL
    SELECT queue, status, finished_at, started_at FROM taskq.jobs
    WHERE status IN ('failed', 'crashed', 'abandoned') AND finished_at > now() - %(minutes)s * interval '1 minute'
      AND (%(readable)s::text[] IS NULL OR queue LIKE ANY(%(readable)s::text[]))
)
SELECT queue, date_trunc('minute', finished_at) AS minute, status, count(*) AS n,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) AS p50,
       percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at)) AS p95
FROM f GROUP BY queue, minute, status ORDER BY queue, minute, status;

-- name: workers_list
-- The registry (a small table) with the number of rows each worker holds in the queues the caller may
-- read (`readable`, NULL: all), from jobs_running_lease_idx.
SELECT w.id, w.host, w.pid, w.queues, w.concurrency, w.started_at, w.last_heartbeat_at, w.lease_expires_at,
       w.stopping, extract(epoch FROM now() - w.last_heartbeat_at)::float8 AS heartbeat_age,
       (SELECT count(*) FROM taskq.jobs AS j WHERE j.worker_id = w.id AND j.status = 'running'
          AND (%(readable)s::text[] IS NULL OR j.queue LIKE ANY(%(readable)s::text[]))) AS held
FROM taskq.workers AS w
ORDER BY w.id;

-- name: queue_known
-- Whether the database knows the queue, as queue_set_paused decides it: a taskq.queues row, or waiting
-- or running jobs naming it (jobs_claim_idx, jobs_running_scope_idx).
SELECT EXISTS (SELECT 1 FROM taskq.queues WHERE name = %(name)s)
    OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status IN ('pending', 'scheduled'))
    OR EXISTS (SELECT 1 FROM taskq.jobs WHERE queue = %(name)s AND status = 'running') AS known;

-- name: worker_held_jobs
SELECT * FROM taskq.jobs WHERE worker_id = %(id)s AND status = 'running' ORDER BY started_at, id LIMIT %(limit)s;
