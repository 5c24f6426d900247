-- taskq schema, version 18: the web API's signal (issue 32): the grant `jobs:signal` and its audit.
--
-- POST /api/v1/jobs/{id}:signal is an operator write like a cancel: it needs a grant of its own
-- (`jobs:signal`, which a token can now be created with) and leaves an audit row, and an 'operator' event on
-- the job's timeline, in the signal's own transaction (outcome 'signalled'; a signal refused because the job
-- has ended: 'conflict'). The CLI's `taskq signal` is audited the same way, as 'db:' || session_user.
-- The functions of migration 15 knew a fixed list of actions, outcomes and grants: these are their next
-- versions, with `jobs:signal` and `signalled` added and nothing else changed. The operator event guard of
-- migration 15 accepts the events of the new writer as it is (the new writer runs as the owner and sets the
-- same transaction-local flag). token_revoke_v15 keeps writing through audit_append_v15, which stays.

CREATE FUNCTION taskq.audit_append_v18(
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
            'jobs:cancel', 'jobs:requeue', 'jobs:enqueue', 'jobs:signal', 'schedules:pause', 'schedules:resume',
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
                'triggered', 'paused', 'resumed', 'unchanged', 'limited', 'created', 'revoked', 'signalled']) THEN
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
            -- the flag the operator event guard of migration 15 checks (with the owner as current_user)
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
REVOKE ALL ON FUNCTION taskq.audit_append_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[],
    bigint[], text[], boolean) FROM PUBLIC;

CREATE FUNCTION taskq.audit_write_v18(
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
    RETURN taskq.audit_append_v18(p_principal, p_action, p_schedule, p_reason, p_request_id, p_idempotency_key,
                                  p_expected_revision, p_detail, p_job_ids, p_queues, p_revisions, p_outcomes,
                                  true);
END
$$;
REVOKE ALL ON FUNCTION taskq.audit_write_v18(text, text, text, text, text, text, bigint, jsonb, uuid[], text[],
    bigint[], text[]) FROM PUBLIC;

CREATE FUNCTION taskq.audit_session_v18(
    p_action text, p_outcome text, p_job_id uuid, p_queue text, p_schedule text, p_reason text, p_detail jsonb
) RETURNS integer
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    v_queue text := p_queue;
BEGIN
    IF p_action IS NULL OR NOT p_action = ANY (ARRAY[
            'jobs:cancel', 'jobs:requeue', 'jobs:signal', 'schedules:pause', 'schedules:resume', 'schedules:trigger',
            'queues:pause', 'queues:resume', 'queues:limit']) THEN
        RAISE EXCEPTION 'taskq audit: % is not a CLI action', coalesce(quote_literal(p_action), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_job_id IS NOT NULL AND v_queue IS NULL THEN
        SELECT j.queue INTO v_queue FROM taskq.jobs AS j WHERE j.id = p_job_id;
    END IF;
    RETURN taskq.audit_append_v18('db:' || session_user, p_action, p_schedule, p_reason, NULL, NULL, NULL,
                                  p_detail, ARRAY[p_job_id], ARRAY[v_queue], ARRAY[NULL::bigint], ARRAY[p_outcome],
                                  false);
END
$$;
REVOKE ALL ON FUNCTION taskq.audit_session_v18(text, text, uuid, text, text, text, jsonb) FROM PUBLIC;

CREATE FUNCTION taskq.token_create_v18(p_name text, p_token_hash text, p_grants text[], p_os_user text)
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
        IF g IS NULL OR g !~ ('^(jobs:read|jobs:enqueue|jobs:cancel|jobs:requeue|jobs:signal|schedules:read|schedules:write|'
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
        PERFORM taskq.audit_append_v18(
            'db:' || session_user, 'tokens:create', NULL, NULL, NULL, NULL, NULL,
            jsonb_strip_nulls(jsonb_build_object('token', p_name, 'grants', to_jsonb(p_grants),
                                                 'os_user_claimed', p_os_user)),
            ARRAY[NULL::uuid], ARRAY[NULL::text], ARRAY[NULL::bigint], ARRAY['created'], false);
    END IF;
END
$$;
REVOKE ALL ON FUNCTION taskq.token_create_v18(text, text, text[], text) FROM PUBLIC;
