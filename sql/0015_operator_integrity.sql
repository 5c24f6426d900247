-- taskq schema, version 15: who may write tokens and the operator audit, and dashboard sessions.
--
-- Tokens are created and revoked only through two owner functions (token_create_v15, token_revoke_v15:
-- EXECUTE for the admin role of sql/roles.sql), which check what they write, take created_by from the
-- database (session_user) and audit themselves. A revoked token stays revoked: revoked_at is write-once
-- for every role, the owner included.
--
-- The operator audit (operator_audit and the 'operator' events of job_events) is appended to only through
-- owner functions: audit_write_v15 (the web role: a live token's name or 'anonymous' as principal) and
-- audit_session_v15 (the CLI: the principal is 'db:' || session_user, pinned by the database). Both check
-- the action and outcome against the known ones, and that each job named exists in the queue named; each
-- row records the database role that wrote it (db_role). A trigger refuses 'operator' events written
-- any other way. A refused write (outcome conflict or unique_key_held) repeated by the same principal,
-- action and job within 60 seconds of its row adds no row and no event: the row's `repeats` counts it
-- and `last_repeat_at` says when the last one came.
--
-- Dashboard sessions (taskq.web_sessions): the cookie holds a random session id, the table its SHA-256,
-- the token it was opened with, its own CSRF secret and its idle and absolute expiry.
--
-- The three SECURITY DEFINER trigger functions of migrations 2 and 11 lose PUBLIC's EXECUTE: a trigger
-- fires without it, and with it any role could attach them to a table of its own.

REVOKE EXECUTE ON FUNCTION taskq.record_lease_loss(), taskq.note_settled(), taskq.settle_dependents_stmt()
    FROM PUBLIC;

-- ---- the audit ------------------------------------------------------------------------------------

ALTER TABLE taskq.operator_audit
    ADD COLUMN db_role        text,
    ADD COLUMN repeats        integer NOT NULL DEFAULT 0 CHECK (repeats >= 0),
    ADD COLUMN last_repeat_at timestamptz;

-- The one writer of operator_audit rows and 'operator' events, owner-only (called by the two below and
-- by the token functions). Returns the number of rows written (a coalesced repeat writes none). p_events:
-- also an 'operator' event on each job's timeline (the web's writes; the CLI's rows go without, as its
-- writes always have).
CREATE FUNCTION taskq.audit_append_v15(
    p_principal text, p_action text, p_schedule text, p_reason text, p_request_id text, p_idempotency_key text,
    p_expected_revision bigint, p_detail jsonb, p_job_ids uuid[], p_queues text[], p_revisions bigint[],
    p_outcomes text[], p_events boolean
) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    n integer := 0;
    i integer;
    v_job uuid;
    v_queue text;
    v_outcome text;
    v_actual text;
    v_prior bigint;
    v_id bigint;
BEGIN
    IF p_action IS NULL OR NOT p_action = ANY (ARRAY[
            'jobs:cancel', 'jobs:requeue', 'jobs:enqueue', 'schedules:pause', 'schedules:resume',
            'schedules:trigger', 'queues:pause', 'queues:resume', 'queues:limit', 'tokens:create',
            'tokens:revoke']) THEN
        RAISE EXCEPTION 'taskq audit: unknown action %', coalesce(quote_literal(p_action), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_principal IS NULL OR length(p_principal) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'taskq audit: a principal is 1-200 characters' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_job_ids), 0) <> coalesce(cardinality(p_queues), 0)
       OR coalesce(cardinality(p_job_ids), 0) <> coalesce(cardinality(p_revisions), 0)
       OR coalesce(cardinality(p_job_ids), 0) <> coalesce(cardinality(p_outcomes), 0) THEN
        RAISE EXCEPTION 'taskq audit: job_ids, queues, revisions and outcomes must have one entry each'
            USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. coalesce(cardinality(p_job_ids), 0) LOOP
        v_job := p_job_ids[i];
        v_queue := p_queues[i];
        v_outcome := p_outcomes[i];
        IF v_outcome IS NULL OR NOT v_outcome = ANY (ARRAY[
                'cancelled', 'cancel_requested', 'requeued', 'enqueued', 'unique_key_held', 'conflict',
                'triggered', 'paused', 'resumed', 'unchanged', 'limited', 'created', 'revoked']) THEN
            RAISE EXCEPTION 'taskq audit: unknown outcome %', coalesce(quote_literal(v_outcome), 'NULL')
                USING ERRCODE = '22023';
        END IF;
        IF v_job IS NOT NULL THEN
            SELECT j.queue INTO v_actual FROM taskq.jobs AS j WHERE j.id = v_job;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'taskq audit: no job %', v_job USING ERRCODE = '22023';
            END IF;
            IF v_actual IS DISTINCT FROM v_queue THEN
                RAISE EXCEPTION 'taskq audit: job % is in queue %, not %', v_job, quote_literal(v_actual),
                    coalesce(quote_literal(v_queue), 'NULL') USING ERRCODE = '22023';
            END IF;
            IF v_outcome IN ('conflict', 'unique_key_held') THEN
                SELECT a.id INTO v_prior FROM taskq.operator_audit AS a
                WHERE a.job_id = v_job AND a.principal = p_principal AND a.action = p_action
                  AND a.outcome = v_outcome AND a.at > now() - interval '60 seconds'
                ORDER BY a.id DESC LIMIT 1 FOR UPDATE;
                IF FOUND THEN
                    UPDATE taskq.operator_audit SET repeats = repeats + 1, last_repeat_at = now()
                    WHERE id = v_prior;
                    CONTINUE;
                END IF;
            END IF;
        END IF;
        INSERT INTO taskq.operator_audit (principal, action, outcome, queue, job_id, schedule, reason, request_id,
                                          idempotency_key, expected_revision, revision, detail, db_role)
        VALUES (p_principal, p_action, v_outcome, v_queue, v_job, p_schedule, p_reason, p_request_id,
                p_idempotency_key, p_expected_revision, p_revisions[i], coalesce(p_detail, '{}'), session_user)
        RETURNING id INTO v_id;
        n := n + 1;
        IF v_job IS NOT NULL AND p_events THEN
            PERFORM set_config('taskq.operator_event', 'audit_append_v15', true);
            INSERT INTO taskq.job_events (job_id, kind, detail)
            VALUES (v_job, 'operator', jsonb_strip_nulls(jsonb_build_object(
                'principal', p_principal, 'action', p_action, 'outcome', v_outcome, 'reason', p_reason,
                'request_id', p_request_id, 'audit_id', v_id, 'revision', p_revisions[i])));
            PERFORM set_config('taskq.operator_event', '', true);
        END IF;
    END LOOP;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION taskq.audit_append_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[],
    bigint[], text[], boolean) FROM PUBLIC;

-- The web server's audit writes (EXECUTE: the web role): the principal is a live token's name, or
-- 'anonymous' (a server without auth).
CREATE FUNCTION taskq.audit_write_v15(
    p_principal text, p_action text, p_schedule text, p_reason text, p_request_id text, p_idempotency_key text,
    p_expected_revision bigint, p_detail jsonb, p_job_ids uuid[], p_queues text[], p_revisions bigint[],
    p_outcomes text[]
) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF p_principal IS DISTINCT FROM 'anonymous' AND NOT EXISTS (
            SELECT 1 FROM taskq.api_tokens AS t WHERE t.name = p_principal AND t.revoked_at IS NULL) THEN
        RAISE EXCEPTION 'taskq audit: % is neither a live token nor anonymous',
            coalesce(quote_literal(p_principal), 'NULL') USING ERRCODE = '42501';
    END IF;
    IF p_action LIKE 'tokens:%' THEN
        RAISE EXCEPTION 'taskq audit: % is written by the token functions only', p_action USING ERRCODE = '42501';
    END IF;
    RETURN taskq.audit_append_v15(p_principal, p_action, p_schedule, p_reason, p_request_id, p_idempotency_key,
                                  p_expected_revision, p_detail, p_job_ids, p_queues, p_revisions, p_outcomes,
                                  true);
END
$$;
REVOKE ALL ON FUNCTION taskq.audit_write_v15(text, text, text, text, text, text, bigint, jsonb, uuid[], text[],
    bigint[], text[]) FROM PUBLIC;

-- The CLI's audit writes (EXECUTE: the client role): one row, the principal 'db:' || session_user; a job
-- given without its queue gets its own. No 'operator' event: the job's own events already say what the
-- command changed, and the row is in the job's audit.
CREATE FUNCTION taskq.audit_session_v15(
    p_action text, p_outcome text, p_job_id uuid, p_queue text, p_schedule text, p_reason text, p_detail jsonb
) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    v_queue text := p_queue;
BEGIN
    IF p_action IS NULL OR NOT p_action = ANY (ARRAY[
            'jobs:cancel', 'jobs:requeue', 'schedules:pause', 'schedules:resume', 'schedules:trigger',
            'queues:pause', 'queues:resume', 'queues:limit']) THEN
        RAISE EXCEPTION 'taskq audit: % is not a CLI action', coalesce(quote_literal(p_action), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_job_id IS NOT NULL AND v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM taskq.jobs AS j WHERE j.id = p_job_id;
    END IF;
    RETURN taskq.audit_append_v15('db:' || session_user, p_action, p_schedule, p_reason, NULL, NULL, NULL,
                                  p_detail, ARRAY[p_job_id], ARRAY[v_queue], ARRAY[NULL::bigint], ARRAY[p_outcome],
                                  false);
END
$$;
REVOKE ALL ON FUNCTION taskq.audit_session_v15(text, text, uuid, text, text, text, jsonb) FROM PUBLIC;

-- 'operator' events come from audit_append_v15 only: it runs as the owner and flags its own insert. The
-- WHEN clause keeps every other kind (the claim and finish paths) free of a function call.
CREATE FUNCTION taskq.operator_event_guard_v15() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    IF current_setting('taskq.operator_event', true) IS DISTINCT FROM 'audit_append_v15'
       OR NOT EXISTS (SELECT 1 FROM pg_class AS c JOIN pg_roles AS r ON r.oid = c.relowner
                      WHERE c.oid = TG_RELID AND r.rolname = current_user) THEN
        RAISE EXCEPTION 'operator events are written only by the audit functions (taskq.audit_write_v15, '
                        'taskq.audit_session_v15)' USING ERRCODE = '42501';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER job_events_operator_guard BEFORE INSERT ON taskq.job_events
    FOR EACH ROW WHEN (NEW.kind = 'operator') EXECUTE FUNCTION taskq.operator_event_guard_v15();

-- ---- tokens ---------------------------------------------------------------------------------------

-- revoked_at is write-once, for every role: a revoked token is never live again (its name stays taken)
CREATE FUNCTION taskq.api_tokens_revoked_once_v15() RETURNS trigger
    LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
    RAISE EXCEPTION 'token % was revoked at %: revoked_at is write-once', quote_literal(OLD.name), OLD.revoked_at
        USING ERRCODE = '42501';
END
$$;
CREATE TRIGGER api_tokens_revoked_once BEFORE UPDATE ON taskq.api_tokens
    FOR EACH ROW WHEN (OLD.revoked_at IS NOT NULL AND NEW.revoked_at IS DISTINCT FROM OLD.revoked_at)
    EXECUTE FUNCTION taskq.api_tokens_revoked_once_v15();

-- A new token (EXECUTE: the admin role). No row when the name is taken. created_by is the database role
-- that asked (session_user); p_os_user, what the caller's OS says its user is, goes to the audit row's
-- detail as `os_user_claimed` only (the environment can say anything).
CREATE FUNCTION taskq.token_create_v15(p_name text, p_token_hash text, p_grants text[], p_os_user text)
    RETURNS TABLE (name text, grants text[], created_at timestamptz, created_by text, last_used_at timestamptz,
                   revoked_at timestamptz)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
#variable_conflict use_column
DECLARE
    g text;
BEGIN
    IF p_token_hash IS NULL OR p_token_hash !~ '^[0-9a-f]{64}$' THEN
        RAISE EXCEPTION 'taskq tokens: token_hash must be a SHA-256 in hex' USING ERRCODE = '22023';
    END IF;
    IF coalesce(cardinality(p_grants), 0) NOT BETWEEN 1 AND 100 THEN
        RAISE EXCEPTION 'taskq tokens: a token has 1-100 grants' USING ERRCODE = '22023';
    END IF;
    FOREACH g IN ARRAY p_grants LOOP
        IF g IS NULL OR g !~ ('^(jobs:read|jobs:enqueue|jobs:cancel|jobs:requeue|schedules:read|schedules:write|'
                              'workers:read|queues:read|queues:write|\*|jobs:\*|schedules:\*|workers:\*|queues:\*)'
                              '@.{1,255}$') THEN
            RAISE EXCEPTION 'taskq tokens: bad grant %', coalesce(quote_literal(g), 'NULL') USING ERRCODE = '22023';
        END IF;
    END LOOP;
    RETURN QUERY
        INSERT INTO taskq.api_tokens AS t (name, token_hash, grants, created_by)
        VALUES (p_name, p_token_hash, p_grants, session_user)
        ON CONFLICT (name) DO NOTHING
        RETURNING t.name, t.grants, t.created_at, t.created_by, t.last_used_at, t.revoked_at;
    IF FOUND THEN
        PERFORM taskq.audit_append_v15(
            'db:' || session_user, 'tokens:create', NULL, NULL, NULL, NULL, NULL,
            jsonb_strip_nulls(jsonb_build_object('token', p_name, 'grants', to_jsonb(p_grants),
                                                 'os_user_claimed', p_os_user)),
            ARRAY[NULL::uuid], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY['created'], false);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION taskq.token_create_v15(text, text, text[], text) FROM PUBLIC;

-- Revoke a token at once (EXECUTE: the admin role), ending its dashboard sessions. No row for an unknown
-- name; `changed` false for a token already revoked.
CREATE FUNCTION taskq.token_revoke_v15(p_name text, p_os_user text)
    RETURNS TABLE (name text, changed boolean)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
#variable_conflict use_column
DECLARE
    v_was timestamptz;
BEGIN
    SELECT t.revoked_at INTO v_was FROM taskq.api_tokens AS t WHERE t.name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_was IS NULL THEN
        UPDATE taskq.api_tokens AS t SET revoked_at = now() WHERE t.name = p_name;
    END IF;
    UPDATE taskq.web_sessions AS s SET ended_at = now() WHERE s.token_name = p_name AND s.ended_at IS NULL;
    PERFORM taskq.audit_append_v15(
        'db:' || session_user, 'tokens:revoke', NULL, NULL, NULL, NULL, NULL,
        jsonb_strip_nulls(jsonb_build_object('token', p_name, 'os_user_claimed', p_os_user)),
        ARRAY[NULL::uuid], ARRAY[NULL::text], ARRAY[NULL::bigint],
        ARRAY[CASE WHEN v_was IS NULL THEN 'revoked' ELSE 'unchanged' END], false);
    name := p_name;
    changed := v_was IS NULL;
    RETURN NEXT;
END
$$;
REVOKE ALL ON FUNCTION taskq.token_revoke_v15(text, text) FROM PUBLIC;

-- ---- dashboard sessions -----------------------------------------------------------------------------

-- One row per dashboard login. id_hash: the SHA-256 (hex) of the random session id the cookie holds;
-- csrf_secret: the key of the session's form tokens (so any web process, after any restart, checks them);
-- idle_expires_at moves forward with use, never past expires_at (the absolute limit); ended_at: logout or
-- the token's revocation. The web role deletes expired and ended rows in bounded batches.
CREATE TABLE taskq.web_sessions (
    id_hash         text        PRIMARY KEY CHECK (id_hash ~ '^[0-9a-f]{64}$'),
    token_name      text        NOT NULL REFERENCES taskq.api_tokens (name) ON DELETE CASCADE,
    csrf_secret     text        NOT NULL CHECK (length(csrf_secret) >= 32),
    created_at      timestamptz NOT NULL DEFAULT now(),
    last_seen_at    timestamptz NOT NULL DEFAULT now(),
    idle_expires_at timestamptz NOT NULL,
    expires_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    CHECK (idle_expires_at <= expires_at)
);
CREATE INDEX web_sessions_token_idx ON taskq.web_sessions (token_name) WHERE ended_at IS NULL;
CREATE INDEX web_sessions_expires_idx ON taskq.web_sessions (expires_at);
