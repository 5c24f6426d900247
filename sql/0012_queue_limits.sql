-- taskq schema: the limited claims as functions, under advisory locks (issue 16: a limit that never binds
-- must cost little).
--
-- Before this migration a limited claim was a pipelined transaction of four statements: set-up, lock the
-- scope rows (SELECT ... FOR NO KEY UPDATE on taskq.queues / taskq.actor_limits), count and claim, commit.
-- Measured on a drain with a limit that never binds: the claimers of a queue queued on its row lock
-- (wait event Lock:transactionid), and the holder was as often idle in its transaction, waiting for its
-- own client to send the next statement (Client:ClientRead after BEGIN), as it was working: the lock was
-- held across the client's turns, on a loaded machine for milliseconds. Each lock also wrote the row's
-- xmax (WAL, a dirty page of the queues table).
--
-- Now one statement, `SELECT * FROM taskq.job_claim_limited(...)` (or job_claim_queue_limited), run in
-- autocommit: the function takes the scope locks, then runs the claim as its next statement, and the
-- statement's transaction commits as soon as it returns. The client is never inside the critical section.
--
-- Why it is still exact. In READ COMMITTED a VOLATILE plpgsql function takes a fresh snapshot for each
-- statement it runs, so the claim (a statement after the locks were granted) sees every earlier
-- claimer's commit: a claimer releases its scope locks at the end of its transaction, after its commit is
-- visible. The counts of running rows and rate_starts are therefore always those of every claim that
-- held the lock before. (Under REPEATABLE READ or SERIALIZABLE the snapshot would be the transaction's
-- first one and that argument fails: the functions refuse to run there.)
--
-- The scope locks: transaction-level advisory locks, in memory, nothing written: key
-- (7461733, hashtext('queue:<name>' or 'actor:<name>')), the two-int form, next to the pruner's gate
-- (7461732, 1). A claimer takes all of its keys in key order (queues and actors mixed), so two claimers
-- never wait for each other in a cycle; two scopes whose names hash alike share a lock (more waiting,
-- never less exactness). Operators' pause and limit changes of a queue take the same lock (sql/queues.sql).
--
-- What each claim locks:
-- - job_claim_queue_limited: every queue it claims from (the names it is given; no table is read first,
--   so a limit set a moment ago cannot slip past the lock);
-- - job_claim_limited: those, and every actor of taskq.actor_limits, read before the locks. An actor
--   limited after that read is not locked by this claim, and its jobs are not claimed by it (they are
--   left to the next claim, which locks it).

CREATE FUNCTION taskq.claim_scope_key(scope text) RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE SET search_path = pg_catalog AS $$ SELECT hashtext(scope) $$;

-- The claim of queues limited by concurrency or rate only, no actor limit anywhere (the statement itself
-- is sql/worker.sql's former job_claim_queue_limited, see there for how it counts).
CREATE FUNCTION taskq.job_claim_queue_limited(p_queues text[], p_limit integer, p_worker_id text,
                                              p_lock_timeout float8)
    RETURNS TABLE (id uuid, actor text, queue text, payload jsonb, attempt integer, max_attempts integer,
                   claim_epoch bigint, progress jsonb, schedule_to_close timestamptz, idempotent boolean,
                   scheduled_for timestamptz, trace_context jsonb)
    LANGUAGE plpgsql VOLATILE
    -- its plan is cached per connection; planned from tiny tables without statistics it would look dear
    -- enough to JIT (a quarter of a second per claim) and be planned again on every call
    SET search_path = pg_catalog SET jit = off SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    k integer;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the limited claim needs READ COMMITTED (it is %)', current_setting('transaction_isolation');
    END IF;
    FOR k IN SELECT DISTINCT taskq.claim_scope_key('queue:' || q) FROM unnest(p_queues) AS q ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(7461733, k);
    END LOOP;
    -- a new statement: a new snapshot, taken with the locks held
    RETURN QUERY
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS ts
    ), qc AS MATERIALIZED (
        SELECT name, concurrency_limit, rate_limit, rate_period
        FROM taskq.queues
        WHERE name = ANY(p_queues::text[]) AND paused_at IS NULL AND concurrency_per_key IS NULL
          AND (concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL)
        LIMIT cardinality(p_queues::text[])
    ), ql AS MATERIALIZED (
        SELECT qc.name,
               greatest(0, least(p_limit::int,
                    CASE WHEN qc.concurrency_limit IS NOT NULL THEN qc.concurrency_limit
                        - (SELECT count(*) FROM taskq.jobs AS j WHERE j.status = 'running' AND j.queue = qc.name) END,
                    CASE WHEN qc.rate_limit IS NOT NULL THEN qc.rate_limit
                        - (SELECT count(*) FROM taskq.rate_starts AS r, clock
                           WHERE r.scope = 'queue:' || qc.name
                             AND r.started_at > clock.ts - qc.rate_period * interval '1 second') END)) AS free
        FROM qc
        WHERE NOT EXISTS (SELECT 1 FROM taskq.actor_limits)
    ), picked AS (
        SELECT c.id, c.prev
        FROM ql CROSS JOIN LATERAL (
            SELECT id, status AS prev, priority, scheduled_at FROM taskq.jobs
            WHERE status IN ('pending', 'scheduled') AND queue = ql.name AND scheduled_at <= now()
            ORDER BY priority, scheduled_at, id
            LIMIT ql.free
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority, c.scheduled_at, c.id
        LIMIT p_limit
    ), claimed AS (
        UPDATE taskq.jobs AS j SET
            revision = j.revision + 1,
            status = 'running',
            attempt = j.attempt + 1,
            claim_epoch = j.claim_epoch + 1,
            worker_id = p_worker_id,
            lock_expires_at = now() + p_lock_timeout::float8 * interval '1 second',
            started_at = clock.ts,
            cancel_phase = 0
        FROM clock
        -- by id, not a join with picked: the cached generic plan guesses picked at a tenth of the
        -- backlog and hash-joins it with a sequential scan of jobs (measured: 40 ms per claim on a
        -- backlog of 30,000, most of what a limit that never binds cost); = ANY(ARRAY(...)) is always
        -- the primary key's index
        WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p))
        RETURNING j.id, j.actor, j.queue, j.payload, j.attempt, j.max_attempts, j.claim_epoch, j.progress,
                  j.schedule_to_close, j.priority, j.idempotent, j.scheduled_for, j.trace_context
    ), att AS (
        INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at)
        SELECT c.id, c.attempt, c.claim_epoch, p_worker_id, clock.ts FROM claimed AS c, clock
    ), ev AS (
        INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
        SELECT c.id, 'state_change', p.prev, 'running', c.attempt, p_worker_id,
               jsonb_build_object('claim_epoch', c.claim_epoch)
        FROM claimed AS c JOIN picked AS p ON p.id = c.id
    ), starts AS (
        INSERT INTO taskq.rate_starts (scope, started_at)
        SELECT 'queue:' || c.queue, clock.ts FROM claimed AS c JOIN qc ON qc.name = c.queue, clock
        WHERE qc.rate_limit IS NOT NULL
    ), trimmed AS (
        DELETE FROM taskq.rate_starts AS r USING qc, clock
        WHERE qc.rate_limit IS NOT NULL AND r.scope = 'queue:' || qc.name
          AND r.started_at <= clock.ts - qc.rate_period * interval '1 second'
    )
    SELECT c.id, c.actor, c.queue, c.payload, c.attempt, c.max_attempts, c.claim_epoch, c.progress,
           c.schedule_to_close, c.idempotent, c.scheduled_for, c.trace_context
    FROM claimed AS c
    ORDER BY c.priority, c.id;
END
$fn$;

-- The general limited claim: queue, actor, per-key and rate limits (the statement is sql/worker.sql's
-- former job_claim_limited; see there for how it counts and ranks).
CREATE FUNCTION taskq.job_claim_limited(p_queues text[], p_limit integer, p_scan integer, p_worker_id text,
                                        p_lock_timeout float8)
    RETURNS TABLE (id uuid, actor text, queue text, payload jsonb, attempt integer, max_attempts integer,
                   claim_epoch bigint, progress jsonb, schedule_to_close timestamptz, idempotent boolean,
                   scheduled_for timestamptz, trace_context jsonb)
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog SET jit = off SET plan_cache_mode = force_generic_plan
AS $fn$
#variable_conflict use_column
DECLARE
    k integer;
    v_actors text[];
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'the limited claim needs READ COMMITTED (it is %)', current_setting('transaction_isolation');
    END IF;
    v_actors := ARRAY(SELECT a.actor FROM taskq.actor_limits AS a);
    FOR k IN
        SELECT DISTINCT key FROM (
            SELECT taskq.claim_scope_key('queue:' || q) AS key FROM unnest(p_queues) AS q
            UNION ALL
            SELECT taskq.claim_scope_key('actor:' || a) FROM unnest(v_actors) AS a
        ) AS s ORDER BY 1
    LOOP
        PERFORM pg_advisory_xact_lock(7461733, k);
    END LOOP;
    RETURN QUERY
    WITH clock AS MATERIALIZED (
        SELECT clock_timestamp() AS ts
    ), qc AS MATERIALIZED (
        SELECT name, concurrency_limit, concurrency_per_key AS per_key, rate_limit, rate_period,
               (concurrency_limit IS NOT NULL OR concurrency_per_key IS NOT NULL OR rate_limit IS NOT NULL) AS limited
        FROM taskq.queues
        WHERE name = ANY(p_queues::text[]) AND paused_at IS NULL
        LIMIT cardinality(p_queues::text[])  -- never cuts (one row per name); tells the planner how few
    ), ql AS MATERIALIZED (
        -- what is left of each queue's limits (NULL: unlimited)
        SELECT qc.name, qc.per_key, qc.limited,
               least(CASE WHEN qc.concurrency_limit IS NOT NULL THEN qc.concurrency_limit
                         - (SELECT count(*) FROM taskq.jobs AS j WHERE j.status = 'running' AND j.queue = qc.name) END,
                     CASE WHEN qc.rate_limit IS NOT NULL THEN qc.rate_limit
                         - (SELECT count(*) FROM taskq.rate_starts AS r, clock
                            WHERE r.scope = 'queue:' || qc.name
                              AND r.started_at > clock.ts - qc.rate_period * interval '1 second') END) AS free
        FROM qc
    ), al AS MATERIALIZED (
        SELECT a.actor, a.concurrency_per_key AS per_key, a.rate_limit, a.rate_period,
               least(CASE WHEN a.global_concurrency IS NOT NULL THEN a.global_concurrency
                         - (SELECT count(*) FROM taskq.jobs AS j
                            WHERE j.status = 'running' AND j.queue IS NOT NULL AND j.actor = a.actor) END,
                     CASE WHEN a.rate_limit IS NOT NULL THEN a.rate_limit
                         - (SELECT count(*) FROM taskq.rate_starts AS r, clock
                            WHERE r.scope = 'actor:' || a.actor
                              AND r.started_at > clock.ts - a.rate_period * interval '1 second') END) AS free
        FROM taskq.actor_limits AS a
        WHERE a.actor = ANY(v_actors)  -- the actors whose scopes we locked
    ), qk AS MATERIALIZED (
        -- running rows per key of the queues with a per-key limit
        SELECT j.queue, j.concurrency_key, count(*) AS n
        FROM ql JOIN taskq.jobs AS j ON j.queue = ql.name AND j.status = 'running' AND j.concurrency_key IS NOT NULL
        WHERE ql.per_key IS NOT NULL
        GROUP BY j.queue, j.concurrency_key
    ), ak AS MATERIALIZED (
        SELECT j.actor, j.concurrency_key, count(*) AS n
        FROM al JOIN taskq.jobs AS j
             ON j.actor = al.actor AND j.status = 'running' AND j.queue IS NOT NULL AND j.concurrency_key IS NOT NULL
        WHERE al.per_key IS NOT NULL
        GROUP BY j.actor, j.concurrency_key
    ), full_actors AS MATERIALIZED (
        -- full, or limited since we read the actor limits and so not locked by us: claimed by nobody now
        SELECT coalesce(array_agg(actor), '{}') AS names FROM (
            SELECT actor FROM al WHERE free <= 0
            UNION ALL
            SELECT a.actor FROM taskq.actor_limits AS a WHERE a.actor <> ALL(v_actors)
        ) AS f
    ), full_keys AS MATERIALIZED (
        -- 'queue' || key or 'actor' || key, as one array the scans test each row against
        SELECT coalesce(array_agg(k), '{}') AS keys FROM (
            SELECT qk.queue || chr(31) || qk.concurrency_key AS k FROM qk JOIN ql ON ql.name = qk.queue
            WHERE qk.n >= ql.per_key
            UNION ALL
            SELECT chr(30) || ak.actor || chr(31) || ak.concurrency_key FROM ak JOIN al ON al.actor = ak.actor
            WHERE ak.n >= al.per_key
        ) AS f
    ), cand AS (
        -- our limited queues, in claim order, skipping actors and keys that are full
        SELECT c.* FROM ql CROSS JOIN full_actors AS fa CROSS JOIN full_keys AS fk
        CROSS JOIN LATERAL (
            SELECT j.id, j.status AS prev, j.priority, j.scheduled_at, j.actor, j.queue, j.concurrency_key
            FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.queue = ql.name AND j.scheduled_at <= now()
              AND ql.limited AND coalesce(ql.free, 1) > 0
              -- CASE: not estimated from the column statistics (see job_claim), so the index scan stays
              AND CASE WHEN cardinality(fa.names) > 0 THEN j.actor <> ALL(fa.names) ELSE true END
              AND CASE WHEN cardinality(fk.keys) > 0 AND j.concurrency_key IS NOT NULL
                       THEN j.queue || chr(31) || j.concurrency_key <> ALL(fk.keys)
                            AND chr(30) || j.actor || chr(31) || j.concurrency_key <> ALL(fk.keys)
                       ELSE true END
            ORDER BY j.priority, j.scheduled_at, j.id
            LIMIT p_scan
            FOR UPDATE OF j SKIP LOCKED
        ) AS c
        UNION ALL
        -- limited actors' jobs in our unlimited queues (jobs_claim_actor_idx)
        SELECT c.* FROM ql CROSS JOIN al CROSS JOIN full_keys AS fk
        CROSS JOIN LATERAL (
            SELECT j.id, j.status AS prev, j.priority, j.scheduled_at, j.actor, j.queue, j.concurrency_key
            FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.actor = al.actor AND j.queue = ql.name
              AND j.scheduled_at <= now() AND NOT ql.limited AND coalesce(al.free, 1) > 0
              AND CASE WHEN cardinality(fk.keys) > 0 AND j.concurrency_key IS NOT NULL
                       THEN chr(30) || j.actor || chr(31) || j.concurrency_key <> ALL(fk.keys) ELSE true END
            ORDER BY j.priority, j.scheduled_at, j.id
            LIMIT p_scan
            FOR UPDATE OF j SKIP LOCKED
        ) AS c
    ), ranked AS (
        SELECT c.*,
               row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.scheduled_at, c.id) AS queue_n,
               row_number() OVER (PARTITION BY c.actor ORDER BY c.priority, c.scheduled_at, c.id) AS actor_n,
               row_number() OVER (PARTITION BY c.queue, c.concurrency_key ORDER BY c.priority, c.scheduled_at, c.id)
                   AS queue_key_n,
               row_number() OVER (PARTITION BY c.actor, c.concurrency_key ORDER BY c.priority, c.scheduled_at, c.id)
                   AS actor_key_n
        FROM cand AS c
    ), picked AS (
        -- each limit passes at most what is left of it (a row another limit drops still counts against the
        -- rest: a claim may take fewer than it could, never more)
        SELECT r.id, r.prev
        FROM ranked AS r
        JOIN ql ON ql.name = r.queue
        LEFT JOIN al ON al.actor = r.actor
        LEFT JOIN qk ON qk.queue = r.queue AND qk.concurrency_key = r.concurrency_key
        LEFT JOIN ak ON ak.actor = r.actor AND ak.concurrency_key = r.concurrency_key
        WHERE (ql.free IS NULL OR r.queue_n <= ql.free)
          AND (al.free IS NULL OR r.actor_n <= al.free)
          AND (ql.per_key IS NULL OR r.concurrency_key IS NULL OR r.queue_key_n + coalesce(qk.n, 0) <= ql.per_key)
          AND (al.per_key IS NULL OR r.concurrency_key IS NULL OR r.actor_key_n + coalesce(ak.n, 0) <= al.per_key)
        ORDER BY r.priority, r.scheduled_at, r.id
        LIMIT p_limit
    ), claimed AS (
        UPDATE taskq.jobs AS j SET
            revision = j.revision + 1,
            status = 'running',
            attempt = j.attempt + 1,
            claim_epoch = j.claim_epoch + 1,
            worker_id = p_worker_id,
            lock_expires_at = now() + p_lock_timeout::float8 * interval '1 second',
            started_at = clock.ts,
            cancel_phase = 0
        FROM clock
        -- by id, not a join with picked: the cached generic plan guesses picked at a tenth of the
        -- backlog and hash-joins it with a sequential scan of jobs (measured: 40 ms per claim on a
        -- backlog of 30,000, most of what a limit that never binds cost); = ANY(ARRAY(...)) is always
        -- the primary key's index
        WHERE j.id = ANY(ARRAY(SELECT p.id FROM picked AS p))
        RETURNING j.id, j.actor, j.queue, j.payload, j.attempt, j.max_attempts, j.claim_epoch, j.progress,
                  j.schedule_to_close, j.priority, j.idempotent, j.scheduled_for, j.trace_context
    ), att AS (
        INSERT INTO taskq.job_attempts (job_id, attempt, claim_epoch, worker_id, started_at)
        SELECT c.id, c.attempt, c.claim_epoch, p_worker_id, clock.ts FROM claimed AS c, clock
    ), ev AS (
        INSERT INTO taskq.job_events (job_id, kind, from_status, to_status, attempt, worker_id, detail)
        SELECT c.id, 'state_change', p.prev, 'running', c.attempt, p_worker_id,
               jsonb_build_object('claim_epoch', c.claim_epoch)
        FROM claimed AS c JOIN picked AS p ON p.id = c.id
    ), starts AS (
        INSERT INTO taskq.rate_starts (scope, started_at)
        SELECT 'queue:' || c.queue, clock.ts FROM claimed AS c JOIN qc ON qc.name = c.queue, clock
        WHERE qc.rate_limit IS NOT NULL
        UNION ALL
        SELECT 'actor:' || c.actor, clock.ts FROM claimed AS c JOIN al ON al.actor = c.actor, clock
        WHERE al.rate_limit IS NOT NULL
    ), trimmed AS (
        -- the starts no window can count any more
        DELETE FROM taskq.rate_starts AS r
        USING (SELECT 'queue:' || name AS scope, rate_period FROM qc WHERE rate_limit IS NOT NULL
               UNION ALL
               SELECT 'actor:' || actor, rate_period FROM al WHERE rate_limit IS NOT NULL) AS w, clock
        WHERE r.scope = w.scope AND r.started_at <= clock.ts - w.rate_period * interval '1 second'
    )
    SELECT c.id, c.actor, c.queue, c.payload, c.attempt, c.max_attempts, c.claim_epoch, c.progress,
           c.schedule_to_close, c.idempotent, c.scheduled_for, c.trace_context
    FROM claimed AS c
    ORDER BY c.priority, c.id;
END
$fn$;
