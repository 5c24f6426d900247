-- taskq least-privilege grants: a WORKER role, a CLIENT role, and optionally a WEB role and an ADMIN role,
-- on the taskq schema.
--
-- This is NOT a migration (`taskq migrate` never runs it, and the named-query loader ignores it: it
-- has no query markers). It is a psql script an operator runs after `taskq migrate`, as the owner of
-- the taskq schema (the role that ran the migration) or a superuser, and again after every taskq
-- upgrade that applied a migration. It is idempotent: it first revokes what it grants.
--
--   psql "$OWNER_DSN" -v ON_ERROR_STOP=1 \
--        -v worker_role=taskq_worker -v client_role=taskq_client \
--        [-v web_role=taskq_web] [-v admin_role=taskq_admin] [-v monitor_role=taskq_monitor] -f roles.sql
--
-- web_role is the role `taskq web` runs as, admin_role the role that runs `taskq tokens create|revoke`.
-- Without them, serving the web API and managing tokens stay the owner's. monitor_role is the role of an
-- autoscaler (KEDA) and of `taskq doctor`: counts and health, no job.
--
-- The roles must exist (CREATE ROLE taskq_worker LOGIN PASSWORD '...'); see docs/security.md for
-- the owner role, the role creation and what each role can and cannot do. Sequences need no grant:
-- job_events.id is an identity column, whose sequence INSERT uses without a privilege of its own.

\set ON_ERROR_STOP on

BEGIN;

-- start from nothing, so that a re-run after an upgrade leaves exactly the grants below
REVOKE ALL ON ALL TABLES IN SCHEMA taskq FROM :"worker_role", :"client_role";
REVOKE ALL ON SCHEMA taskq FROM :"worker_role", :"client_role";
REVOKE ALL ON FUNCTION taskq.delete_terminal_jobs(uuid[]), taskq.delete_finished_attempts(uuid[], bigint[]),
    taskq.revive_dependents(uuid[], text), taskq.settle_backlog(integer),
    taskq.delete_operator_requests(text[], text[], float8), taskq.delete_operator_audit(bigint[], float8),
    taskq.audit_session_v15(text, text, uuid, text, text, text, jsonb), taskq.delete_terminal_jobs_v17(uuid[]),
    taskq.signal_ready_v17(uuid, text), taskq.audit_session_v18(text, text, uuid, text, text, text, jsonb),
    taskq.queue_depth_v19(text[])
    FROM :"worker_role", :"client_role";
-- owner-only: the three trigger functions (a trigger fires without EXECUTE), the audit's one writer (the
-- functions below call it as the owner), the audit function of the web role and the token functions of the
-- admin role: revoked from PUBLIC by their migrations, and from the roles here
REVOKE ALL ON FUNCTION taskq.record_lease_loss(), taskq.note_settled(), taskq.settle_dependents_stmt(),
    taskq.audit_append_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[],
        boolean),
    taskq.audit_write_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[]),
    taskq.token_create_v15(text, text, text[], text), taskq.token_revoke_v15(text, text),
    taskq.operator_event_guard_v15(), taskq.api_tokens_revoked_once_v15(),
    taskq.audit_append_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[],
        boolean),
    taskq.audit_write_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[]),
    taskq.token_create_v18(text, text, text[], text)
    FROM PUBLIC, :"worker_role", :"client_role";

GRANT USAGE ON SCHEMA taskq TO :"worker_role", :"client_role";

-- WORKER (`taskq worker`, `taskq run`: claim, heartbeat, finish, release, sweep, reclaim, child jobs,
-- pruning; also the role to run `taskq prune` with). DML only, and on jobs only the columns the runtime
-- writes: a worker can never rewrite a job's payload, actor, queue or options, nor forge or clear an
-- operator's cancel request. It deletes nothing directly: retention goes through two owner functions
-- that delete only terminal jobs (with their events) and finished attempts rows.
GRANT SELECT ON taskq.jobs TO :"worker_role";
GRANT INSERT (id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at,
              schedule_to_close, parent_id, unique_key, unique_scope, idempotent,
              schedule, scheduled_for, trace_context, concurrency_key, parents_remaining, dependency_mode,
              cancel_requested_at, cancel_reason, error_class, error_message, finished_at, fairness_key, fair_tag,
              workflow_id)
    ON taskq.jobs TO :"worker_role";
-- max_attempts and snooze_count: a snooze gives its attempt back; idempotent: set before the first run of
-- a non-idempotent actor enqueued by name; trace_context: a traced retry writes its first attempt's span
GRANT UPDATE (status, attempt, claim_epoch, worker_id, lock_expires_at, started_at, finished_at,
              scheduled_at, cancel_phase, result, error_class, error_message, interrupt_count, progress,
              max_attempts, snooze_count, idempotent, revision, has_dependents, trace_context, fair_tag,
              wait_kind, wait_signal)
    ON taskq.jobs TO :"worker_role";
GRANT SELECT, INSERT ON taskq.job_events TO :"worker_role";
-- child jobs with depends_on (ctx.jobs.enqueue): their edges; the cascade that resolves them runs as the
-- owner (the jobs_settle_dependents trigger)
GRANT SELECT, INSERT ON taskq.job_dependencies TO :"worker_role";
-- the resolver settles the edges a terminal transaction left beyond its chunk through an owner function
GRANT EXECUTE ON FUNCTION taskq.settle_backlog(integer) TO :"worker_role";
GRANT SELECT, INSERT, UPDATE ON taskq.job_attempts TO :"worker_role";
GRANT EXECUTE ON FUNCTION taskq.delete_terminal_jobs(uuid[]), taskq.delete_terminal_jobs_v17(uuid[])
    TO :"worker_role";
GRANT EXECUTE ON FUNCTION taskq.delete_finished_attempts(uuid[], bigint[]) TO :"worker_role";
-- retention of the web API's idempotency receipts and audit rows: the batch reads them (oldest first),
-- the owner functions delete only rows past the window (the audit: never one younger than an hour)
GRANT SELECT ON taskq.operator_requests, taskq.operator_audit TO :"worker_role";
GRANT EXECUTE ON FUNCTION taskq.delete_operator_requests(text[], text[], float8),
    taskq.delete_operator_audit(bigint[], float8) TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON taskq.workers TO :"worker_role";
-- the heartbeat reads and deletes its own lease losses; the trigger that records them runs as the owner
GRANT SELECT, DELETE ON taskq.lease_losses TO :"worker_role";
GRANT SELECT ON taskq.schema_migrations TO :"worker_role";
-- `taskq check` (sql/invariants.sql) reads the dependency backlog; writing it stays the owner functions'
GRANT SELECT ON taskq.dependency_backlog TO :"worker_role", :"client_role";
-- the scheduler: upserts its code's declarations, disables the ones gone, fires slots (never deletes)
GRANT SELECT, INSERT, UPDATE ON taskq.schedules TO :"worker_role";
-- queue control: a worker registers its queues (their rows, first use), writes its code's actor limits,
-- and logs and trims the starts of rate-limited scopes. Its limited claims lock their scopes with advisory
-- locks (sql/0012_queue_limits.sql), which need no privilege on the tables.
GRANT SELECT, INSERT (name) ON taskq.queues TO :"worker_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON taskq.actor_limits TO :"worker_role";
GRANT SELECT, INSERT, DELETE ON taskq.rate_starts TO :"worker_role";
-- fair share (sql/0016_fair_claims.sql): jobs a worker enqueues (ctx.jobs.enqueue) are tagged as any
-- producer's (fair_bases_v16 marks a queue fair at its first keyed job); due jobs written to start later
-- are tagged by fair_promote_v16; the v16 limited claims
GRANT SELECT, INSERT ON taskq.fair_queues TO :"worker_role";
GRANT SELECT ON taskq.fairness_weights TO :"worker_role";
GRANT EXECUTE ON FUNCTION taskq.fair_bases_v16(text, text[], integer, boolean), taskq.fair_promote_v16(text[]),
    taskq.job_claim_limited_v16(text[], integer, integer, text, float8, text[], text[]),
    taskq.job_claim_queue_limited_v16(text[], integer, text, float8, text[], text[]) TO :"worker_role";
-- durable jobs (sql/0017_durable_jobs.sql): an attempt stores its steps, sleeps and waits (fenced: it locks
-- its job's row FOR SHARE, which the UPDATE grant above allows), takes the signals sent to its job, may send
-- signals (ctx), and asks whether one is there when it suspends
GRANT SELECT, INSERT, UPDATE ON taskq.job_steps TO :"worker_role";
GRANT SELECT, INSERT, UPDATE (consumed_at, consumed_attempt, consumed_epoch, consumed_by)
    ON taskq.job_signals TO :"worker_role";
GRANT EXECUTE ON FUNCTION taskq.signal_ready_v17(uuid, text) TO :"worker_role";

-- CLIENT (JobsClient and the CLI's enqueue, cancel, requeue, jobs, job): enqueue, cancel, requeue, read.
-- It inserts only the columns of a new job (so only a pending or scheduled row: the CHECK constraints
-- refuse any other status without the columns it may not set) and updates only the cancel columns
-- (cancelling a waiting job, or flagging a running one for its worker) and the columns an operator's
-- requeue resets (a failed, crashed or abandoned job back to pending; worker_id is cleared, never set:
-- without lock_expires_at no row can be made running). It cannot claim a job, write a result, touch
-- attempts or write the worker registry (it may read it, for the dashboard), delete jobs or change the schema.
GRANT SELECT ON taskq.jobs TO :"client_role";
-- (a job enqueued with depends_on on a parent already failed is written cancelled, ParentFailed, at once)
GRANT INSERT (id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at,
              schedule_to_close, parent_id, unique_key, unique_scope, idempotent,
              schedule, scheduled_for, trace_context, concurrency_key, parents_remaining, dependency_mode,
              cancel_requested_at, cancel_reason, error_class, error_message, finished_at, fairness_key, fair_tag,
              workflow_id)
    ON taskq.jobs TO :"client_role";
-- has_dependents: set on the parents (under their row lock) by the enqueue of a child
GRANT UPDATE (status, cancel_phase, cancel_requested_at, cancel_reason, error_class, finished_at,
              scheduled_at, max_attempts, requeue_count, started_at, worker_id, error_message, schedule_to_close,
              revision, has_dependents, fair_tag, wait_kind, wait_signal)
    ON taskq.jobs TO :"client_role";
-- No grant on api_tokens, operator_requests, operator_audit or web_sessions: tokens, receipts, the audit and
-- sessions are the web role's and the admin role's. The CLI's operator writes (cancel, requeue, queue and
-- schedule pause|resume|limit|trigger) are audited through an owner function that writes the principal
-- 'db:' || session_user and nothing else; 'operator' events on job_events are refused to every direct
-- insert (a trigger), whatever the INSERT grant below.
GRANT EXECUTE ON FUNCTION taskq.audit_session_v15(text, text, uuid, text, text, text, jsonb),
    taskq.audit_session_v18(text, text, uuid, text, text, text, jsonb) TO :"client_role";
-- the dashboard's workers page and GET /api/v1/workers: the registry, read only (hosts, pids, queues,
-- heartbeats and leases; no secret). Writing it stays the worker role's.
GRANT SELECT ON taskq.workers TO :"client_role";
GRANT SELECT, INSERT ON taskq.job_events TO :"client_role";
-- enqueue with depends_on writes the edges; requeue(cascade=True) revives cascaded children through an
-- owner function
GRANT SELECT, INSERT ON taskq.job_dependencies TO :"client_role";
GRANT EXECUTE ON FUNCTION taskq.revive_dependents(uuid[], text) TO :"client_role";
GRANT SELECT ON taskq.job_attempts TO :"client_role";
GRANT SELECT ON taskq.schema_migrations TO :"client_role";
-- `taskq schedules`, `taskq schedule pause|resume|trigger`: read, the pause columns, the trigger's bookkeeping
GRANT SELECT ON taskq.schedules TO :"client_role";
GRANT UPDATE (paused_at, paused_by, resumed_at, last_job_id, last_run_at, last_outcome, updated_at)
    ON taskq.schedules TO :"client_role";
-- `taskq queues`, `taskq queue pause|resume|limit`, `taskq job` (what a waiting job waits for): read, the
-- pause and limit columns (a queue's row is created at its first pause or limit), the queue's timeline
GRANT SELECT ON taskq.queues, taskq.actor_limits, taskq.rate_starts, taskq.queue_events TO :"client_role";
GRANT INSERT (name, paused_at, paused_by, pause_reason, concurrency_limit, concurrency_per_key, rate_limit,
              rate_period)
    ON taskq.queues TO :"client_role";
GRANT UPDATE (paused_at, paused_by, pause_reason, concurrency_limit, concurrency_per_key, rate_limit,
              rate_period, updated_at)
    ON taskq.queues TO :"client_role";
GRANT INSERT ON taskq.queue_events TO :"client_role";
-- fair share: enqueue tags jobs (fair_bases_v16); `taskq queue weight` writes a weight and re-spaces the
-- key's ready jobs (fair_retag_v16, which updates only fair_tag)
GRANT SELECT, INSERT ON taskq.fair_queues TO :"client_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON taskq.fairness_weights TO :"client_role";
GRANT EXECUTE ON FUNCTION taskq.fair_bases_v16(text, text[], integer, boolean), taskq.fair_retag_v16(text, text)
    TO :"client_role";
-- durable jobs: read a job's steps and signals (taskq job), send a signal (its row: the sender's; taking it
-- stays the worker's), and requeue(reset_steps=True) deletes the job's stored steps
GRANT SELECT, DELETE ON taskq.job_steps TO :"client_role";
GRANT SELECT, INSERT (job_id, name, payload, sent_by) ON taskq.job_signals TO :"client_role";
GRANT EXECUTE ON FUNCTION taskq.signal_ready_v17(uuid, text) TO :"client_role";
-- the depth of a queue group for an autoscaler (sql/0019_queue_depth.sql, docs/kubernetes.md): a count, read
-- by every role that reads the queue (a definer function, revoked from PUBLIC by its migration)
GRANT EXECUTE ON FUNCTION taskq.queue_depth_v19(text[]) TO :"worker_role", :"client_role";

COMMIT;

-- WEB (`taskq web`): the client role's reads and operator writes (enqueue, cancel, requeue, pause, limits),
-- and the web API's own tables: token checks (SELECT, and only last_used_at written), idempotency receipts
-- (never deleted: retention deletes them through an owner function), dashboard sessions, and the audit,
-- appended to through its owner function only (it checks the principal is a live token or anonymous).
\if :{?web_role}
BEGIN;
REVOKE ALL ON ALL TABLES IN SCHEMA taskq FROM :"web_role";
REVOKE ALL ON SCHEMA taskq FROM :"web_role";
REVOKE ALL ON FUNCTION taskq.revive_dependents(uuid[], text), taskq.signal_ready_v17(uuid, text),
    taskq.queue_depth_v19(text[]),
    taskq.audit_write_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[]),
    taskq.audit_write_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[])
    FROM :"web_role";
GRANT USAGE ON SCHEMA taskq TO :"web_role";
GRANT SELECT ON taskq.jobs, taskq.job_events, taskq.job_dependencies, taskq.job_attempts, taskq.workers,
    taskq.schema_migrations, taskq.schedules, taskq.dependency_backlog,
    taskq.queues, taskq.actor_limits, taskq.rate_starts, taskq.queue_events TO :"web_role";
GRANT INSERT (id, actor, queue, payload, status, priority, tags, max_attempts, scheduled_at,
              schedule_to_close, parent_id, unique_key, unique_scope, idempotent,
              schedule, scheduled_for, trace_context, concurrency_key, parents_remaining, dependency_mode,
              cancel_requested_at, cancel_reason, error_class, error_message, finished_at, fairness_key, fair_tag,
              workflow_id)
    ON taskq.jobs TO :"web_role";
GRANT UPDATE (status, cancel_phase, cancel_requested_at, cancel_reason, error_class, finished_at,
              scheduled_at, max_attempts, requeue_count, started_at, worker_id, error_message, schedule_to_close,
              revision, has_dependents, fair_tag, wait_kind, wait_signal)
    ON taskq.jobs TO :"web_role";
GRANT INSERT ON taskq.job_events, taskq.job_dependencies, taskq.queue_events TO :"web_role";
GRANT EXECUTE ON FUNCTION taskq.revive_dependents(uuid[], text) TO :"web_role";
GRANT UPDATE (paused_at, paused_by, resumed_at, last_job_id, last_run_at, last_outcome, updated_at)
    ON taskq.schedules TO :"web_role";
GRANT INSERT (name, paused_at, paused_by, pause_reason, concurrency_limit, concurrency_per_key, rate_limit,
              rate_period)
    ON taskq.queues TO :"web_role";
GRANT UPDATE (paused_at, paused_by, pause_reason, concurrency_limit, concurrency_per_key, rate_limit,
              rate_period, updated_at)
    ON taskq.queues TO :"web_role";
GRANT SELECT, INSERT ON taskq.fair_queues TO :"web_role";
GRANT SELECT, INSERT, UPDATE, DELETE ON taskq.fairness_weights TO :"web_role";
GRANT EXECUTE ON FUNCTION taskq.fair_bases_v16(text, text[], integer, boolean), taskq.fair_retag_v16(text, text)
    TO :"web_role";
GRANT SELECT, DELETE ON taskq.job_steps TO :"web_role";
GRANT SELECT, INSERT (job_id, name, payload, sent_by) ON taskq.job_signals TO :"web_role";
GRANT EXECUTE ON FUNCTION taskq.signal_ready_v17(uuid, text) TO :"web_role";
GRANT SELECT, UPDATE (last_used_at) ON taskq.api_tokens TO :"web_role";
GRANT SELECT, INSERT, UPDATE (fingerprint, status, body, created_at) ON taskq.operator_requests TO :"web_role";
GRANT SELECT ON taskq.operator_audit TO :"web_role";
GRANT SELECT, INSERT, UPDATE (last_seen_at, idle_expires_at, ended_at), DELETE ON taskq.web_sessions
    TO :"web_role";
GRANT EXECUTE ON FUNCTION
    taskq.audit_write_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[]),
    taskq.audit_write_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[], bigint[], text[])
    TO :"web_role";
GRANT EXECUTE ON FUNCTION taskq.queue_depth_v19(text[]) TO :"web_role";
COMMIT;
\endif

-- ADMIN (`taskq tokens create|list|revoke`): reads the tokens, creates and revokes them through the owner
-- functions (which check the grants, set created_by to the database role, keep revoked_at write-once, end
-- a revoked token's sessions and audit both), and reads the audit. It writes no table directly.
\if :{?admin_role}
BEGIN;
REVOKE ALL ON ALL TABLES IN SCHEMA taskq FROM :"admin_role";
REVOKE ALL ON SCHEMA taskq FROM :"admin_role";
REVOKE ALL ON FUNCTION taskq.token_create_v15(text, text, text[], text), taskq.token_revoke_v15(text, text),
    taskq.token_create_v18(text, text, text[], text)
    FROM :"admin_role";
GRANT USAGE ON SCHEMA taskq TO :"admin_role";
GRANT SELECT ON taskq.api_tokens, taskq.operator_audit, taskq.schema_migrations TO :"admin_role";
GRANT EXECUTE ON FUNCTION taskq.token_create_v15(text, text, text[], text), taskq.token_revoke_v15(text, text),
    taskq.token_create_v18(text, text, text[], text)
    TO :"admin_role";
COMMIT;
\endif

-- MONITOR (an autoscaler such as KEDA, and `taskq doctor`): reads counts and health, never a job. It may run
-- the queue-depth function (a count over the jobs, as the owner), read the schema version and the worker
-- registry (hosts, pids, queues, heartbeats: no secret). It reads no job, payload, result or token. For the
-- server-wide checks of `taskq doctor` (other sessions' transactions and queries), a superuser also grants
-- it PostgreSQL's own pg_monitor role (docs/doctor.md); without it those checks say what they cannot see.
\if :{?monitor_role}
BEGIN;
REVOKE ALL ON ALL TABLES IN SCHEMA taskq FROM :"monitor_role";
REVOKE ALL ON SCHEMA taskq FROM :"monitor_role";
REVOKE ALL ON FUNCTION taskq.queue_depth_v19(text[]) FROM :"monitor_role";
GRANT USAGE ON SCHEMA taskq TO :"monitor_role";
GRANT SELECT ON taskq.schema_migrations, taskq.workers TO :"monitor_role";
GRANT EXECUTE ON FUNCTION taskq.queue_depth_v19(text[]) TO :"monitor_role";
COMMIT;
\endif
