-- taskq schema, version 16: claims that share well (issue 31).
--
-- Fair share inside a queue. A job may carry a fairness key (a tenant); jobs without one share the empty
-- key. In a fair queue (taskq.fair_queues: a keyed job was enqueued there, or a weight was set) every job
-- gets a fair_tag when it is written: its virtual start time among the ready jobs of its (queue, priority).
-- A key's jobs are spaced 1/weight apart, starting from the later of the head of the queue (the smallest
-- tag of a due job at that priority) and the key's own last tag. Claims take jobs in the order
-- (priority, fair_tag NULLS FIRST, scheduled_at, id), one ordered index scan as before, so starts are shared
-- among the keys with ready jobs in proportion to their weights, across every worker of the fleet, and a
-- key with nothing ready takes no share (it gets no credit for its idle time: its next jobs start from
-- the head). In a queue without fairness every tag is NULL and the order is the one of before.
--
-- A job written to start later (scheduled_at in the future) is tagged 'Infinity' until it is due, then
-- taskq.fair_promote_v16 (run by workers every poll interval) gives it a tag from the head at that time.
-- A retried, snoozed, released or requeued job keeps its tag: it goes back to the front of its key.
--
-- The tags are computed by the producers from committed rows, without a lock: two producers enqueueing
-- for the same key at the same moment may give their jobs equal tags (the tie is broken by scheduled_at
-- and id), which is the only inexactness besides SKIP LOCKED's.
--
-- Capacity per isolation class: workers register the capacity of each class and the class of each of
-- their actors (taskq.workers), and the limited claims take an actor filter (p_only, p_except) so that a
-- worker running actors of several classes claims for each class only what a free slot can start.

ALTER TABLE taskq.jobs
    ADD COLUMN fairness_key text,
    ADD COLUMN fair_tag float8,
    ADD CONSTRAINT jobs_fairness_key_text CHECK (
        fairness_key <> '' AND length(fairness_key) <= 200 AND fairness_key !~ '[[:cntrl:]]');

CREATE TABLE taskq.fair_queues (
    queue       text PRIMARY KEY CHECK (queue <> '' AND length(queue) <= 255),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE taskq.fairness_weights (
    queue       text NOT NULL CHECK (queue <> '' AND length(queue) <= 255),
    key         text NOT NULL CHECK (length(key) <= 200 AND key !~ '[[:cntrl:]]'),
    weight      float8 NOT NULL CHECK (weight > 0 AND weight <= 1000000),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    updated_by  text,
    PRIMARY KEY (queue, key)
);

ALTER TABLE taskq.workers
    ADD COLUMN capacity_async integer CHECK (capacity_async >= 0),
    ADD COLUMN capacity_thread integer CHECK (capacity_thread >= 0),
    ADD COLUMN capacity_process integer CHECK (capacity_process >= 0),
    ADD COLUMN actor_isolation jsonb;

-- the claim order: the tag after the priority (NULLS FIRST: jobs written before their queue became fair
-- go first, and in a queue without fairness the order is (priority, scheduled_at, id) as before)
DROP INDEX taskq.jobs_claim_idx;
CREATE INDEX jobs_claim_idx ON taskq.jobs (queue, priority, fair_tag NULLS FIRST, scheduled_at, id)
    WHERE status IN ('pending', 'scheduled');
DROP INDEX taskq.jobs_claim_actor_idx;
CREATE INDEX jobs_claim_actor_idx ON taskq.jobs (actor, queue, priority, fair_tag NULLS FIRST, scheduled_at, id)
    WHERE status IN ('pending', 'scheduled');
-- a key's last tag (fair_bases_v16), its ready jobs (retag, taskq queues --keys); only tagged rows
CREATE INDEX jobs_fair_key_idx ON taskq.jobs (queue, (coalesce(fairness_key, '')), priority, fair_tag)
    WHERE status IN ('pending', 'scheduled') AND fair_tag IS NOT NULL;

-- the jobs of fair queues written to start later, until due and tagged (fair_promote_v16)
CREATE INDEX jobs_fair_later_idx ON taskq.jobs (queue, scheduled_at)
    WHERE fair_tag = 'Infinity' AND status IN ('pending', 'scheduled');

-- Where the next jobs of each key start: (key, base, step) per key of p_keys ('' = jobs without a key); the
-- i-th job of a key (from 1) gets base + i * step. One head for all the keys; a key goes on from its own
-- last tag when it is backlogged. p_due false (the jobs start later): base Infinity, tagged when due.
-- Marks the queue fair when a key is given.
CREATE FUNCTION taskq.fair_bases_v16(p_queue text, p_keys text[], p_priority integer, p_due boolean)
    RETURNS TABLE (key text, base float8, step float8)
    LANGUAGE plpgsql VOLATILE
    -- index probes only: a plan cached while the table was small (or not analyzed) must not read it all
    SET search_path = pg_catalog SET jit = off SET enable_seqscan = off
AS $fn$
#variable_conflict use_column
DECLARE
    v_head float8;
BEGIN
    IF NOT p_due THEN
        RETURN QUERY SELECT k.k, 'Infinity'::float8, 0::float8 FROM unnest(p_keys) AS k(k);
        RETURN;
    END IF;
    IF '' <> ANY(p_keys) AND NOT EXISTS (SELECT 1 FROM taskq.fair_queues AS f WHERE f.queue = p_queue) THEN
        INSERT INTO taskq.fair_queues (queue) VALUES (p_queue) ON CONFLICT DO NOTHING;
    END IF;
    -- the head: the next due job of this priority in claim order (jobs_claim_idx)
    v_head := (SELECT j.fair_tag FROM taskq.jobs AS j
               WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue AND j.priority = p_priority
                 AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity' AND j.scheduled_at <= now()
               ORDER BY j.fair_tag NULLS FIRST LIMIT 1);
    IF v_head IS NULL THEN
        -- nothing due at this priority: after every tag still waiting, and never behind the clock (in
        -- thousandths of a second since 2026), so that a job retried with an old tag is not put far behind
        v_head := greatest(
            (SELECT j.fair_tag FROM taskq.jobs AS j
             WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue AND j.priority = p_priority
               AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity'
             ORDER BY j.fair_tag DESC NULLS LAST LIMIT 1),
            (extract(epoch FROM now()) - 1767225600) * 1000);
    END IF;
    RETURN QUERY
    SELECT k.k,
           -- the key's own last tag (jobs_fair_key_idx): a backlogged key goes on from there
           greatest(v_head, (SELECT j.fair_tag FROM taskq.jobs AS j
                             WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue
                               AND coalesce(j.fairness_key, '') = k.k AND j.priority = p_priority
                               AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity'
                             ORDER BY j.fair_tag DESC LIMIT 1)),
           1.0 / coalesce(w.weight, 1.0)
    FROM unnest(p_keys) AS k(k)
    LEFT JOIN taskq.fairness_weights AS w ON w.queue = p_queue AND w.key = k.k;
END
$fn$;

-- After a weight change: the key's due jobs of each priority are spaced by the new weight from the head.
CREATE FUNCTION taskq.fair_retag_v16(p_queue text, p_key text) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    -- index probes only: a plan cached while the table was small (or not analyzed) must not read it all
    SET search_path = pg_catalog SET jit = off SET enable_seqscan = off
AS $fn$
DECLARE
    v_priority integer;
    v_base float8[];
    v_n integer;
    v_total integer := 0;
BEGIN
    FOR v_priority IN
        SELECT DISTINCT j.priority FROM taskq.jobs AS j
        WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue AND coalesce(j.fairness_key, '') = p_key
          AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity'
    LOOP
        -- the head, ignoring this key's own jobs (they are the ones moved)
        v_base := ARRAY[coalesce(
            (SELECT j.fair_tag FROM taskq.jobs AS j
             WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue AND j.priority = v_priority
               AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity' AND j.scheduled_at <= now()
               AND coalesce(j.fairness_key, '') <> p_key
             ORDER BY j.fair_tag NULLS FIRST LIMIT 1),
            (SELECT min(j.fair_tag) FROM taskq.jobs AS j
             WHERE j.status IN ('pending', 'scheduled') AND j.queue = p_queue AND coalesce(j.fairness_key, '') = p_key
               AND j.priority = v_priority AND j.fair_tag IS NOT NULL AND j.fair_tag < 'Infinity')),
            1.0 / coalesce((SELECT w.weight FROM taskq.fairness_weights AS w
                            WHERE w.queue = p_queue AND w.key = p_key), 1.0)];
        UPDATE taskq.jobs AS j SET fair_tag = v_base[1] + r.n * v_base[2], revision = j.revision + 1
        FROM (SELECT k.id, row_number() OVER (ORDER BY k.fair_tag, k.scheduled_at, k.id) - 1 AS n
              FROM taskq.jobs AS k
              WHERE k.status IN ('pending', 'scheduled') AND k.queue = p_queue
                AND coalesce(k.fairness_key, '') = p_key AND k.priority = v_priority
                AND k.fair_tag IS NOT NULL AND k.fair_tag < 'Infinity') AS r
        WHERE j.id = r.id AND j.status IN ('pending', 'scheduled');
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;
    RETURN v_total;
END
$fn$;

-- Jobs of fair queues among p_queues that were written to start later and are due now: tagged from the
-- head, key by key, as if enqueued now (in the order they became due). Returns how many.
CREATE FUNCTION taskq.fair_promote_v16(p_queues text[]) RETURNS integer
    LANGUAGE plpgsql VOLATILE
    -- index probes only: a plan cached while the table was small (or not analyzed) must not read it all
    SET search_path = pg_catalog SET jit = off SET enable_seqscan = off
AS $fn$
DECLARE
    g record;
    v_base float8[];
    v_n integer;
    v_total integer := 0;
BEGIN
    FOR g IN
        SELECT DISTINCT j.queue, coalesce(j.fairness_key, '') AS key, j.priority
        FROM taskq.fair_queues AS f
        JOIN taskq.jobs AS j ON j.queue = f.queue
        WHERE f.queue = ANY(p_queues) AND j.status IN ('pending', 'scheduled') AND j.fair_tag = 'Infinity'
          AND j.scheduled_at <= now()
    LOOP
        v_base := (SELECT ARRAY[b.base, b.step]
                   FROM taskq.fair_bases_v16(g.queue, ARRAY[g.key], g.priority, true) AS b);
        UPDATE taskq.jobs AS j SET fair_tag = v_base[1] + r.n * v_base[2], revision = j.revision + 1
        FROM (SELECT l.id, row_number() OVER (ORDER BY l.scheduled_at, l.id) AS n
              FROM (SELECT k.id, k.scheduled_at FROM taskq.jobs AS k
                    WHERE k.status IN ('pending', 'scheduled') AND k.queue = g.queue AND k.priority = g.priority
                      AND coalesce(k.fairness_key, '') = g.key AND k.fair_tag = 'Infinity'
                      AND k.scheduled_at <= now()
                    FOR UPDATE SKIP LOCKED) AS l) AS r
        WHERE j.id = r.id;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
    END LOOP;
    RETURN v_total;
END
$fn$;

-- The limited claims of migration 12, in the fair order, with an actor filter: p_only NULL takes any
-- actor, else only these; p_except (NULL or empty: none) leaves these out.
CREATE FUNCTION taskq.job_claim_queue_limited_v16(p_queues text[], p_limit integer, p_worker_id text,
                                              p_lock_timeout float8,
        p_only text[], p_except text[])
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
            SELECT id, status AS prev, priority, fair_tag, scheduled_at FROM taskq.jobs
            WHERE status IN ('pending', 'scheduled') AND queue = ql.name AND scheduled_at <= now()
              AND (p_only IS NULL OR actor = ANY(p_only))
              AND CASE WHEN cardinality(p_except) > 0 THEN actor <> ALL(p_except) ELSE true END
            ORDER BY priority, fair_tag NULLS FIRST, scheduled_at, id
            LIMIT ql.free
            FOR UPDATE SKIP LOCKED
        ) AS c
        ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id
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

CREATE FUNCTION taskq.job_claim_limited_v16(p_queues text[], p_limit integer, p_scan integer, p_worker_id text,
                                        p_lock_timeout float8,
        p_only text[], p_except text[])
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
            SELECT j.id, j.status AS prev, j.priority, j.fair_tag, j.scheduled_at, j.actor, j.queue, j.concurrency_key
            FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.queue = ql.name AND j.scheduled_at <= now()
              AND (p_only IS NULL OR j.actor = ANY(p_only))
              AND CASE WHEN cardinality(p_except) > 0 THEN j.actor <> ALL(p_except) ELSE true END
              AND ql.limited AND coalesce(ql.free, 1) > 0
              -- CASE: not estimated from the column statistics (see job_claim), so the index scan stays
              AND CASE WHEN cardinality(fa.names) > 0 THEN j.actor <> ALL(fa.names) ELSE true END
              AND CASE WHEN cardinality(fk.keys) > 0 AND j.concurrency_key IS NOT NULL
                       THEN j.queue || chr(31) || j.concurrency_key <> ALL(fk.keys)
                            AND chr(30) || j.actor || chr(31) || j.concurrency_key <> ALL(fk.keys)
                       ELSE true END
            ORDER BY j.priority, j.fair_tag NULLS FIRST, j.scheduled_at, j.id
            LIMIT p_scan
            FOR UPDATE OF j SKIP LOCKED
        ) AS c
        UNION ALL
        -- limited actors' jobs in our unlimited queues (jobs_claim_actor_idx)
        SELECT c.* FROM ql CROSS JOIN al CROSS JOIN full_keys AS fk
        CROSS JOIN LATERAL (
            SELECT j.id, j.status AS prev, j.priority, j.fair_tag, j.scheduled_at, j.actor, j.queue, j.concurrency_key
            FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.actor = al.actor AND j.queue = ql.name
              AND (p_only IS NULL OR j.actor = ANY(p_only))
              AND CASE WHEN cardinality(p_except) > 0 THEN j.actor <> ALL(p_except) ELSE true END
              AND j.scheduled_at <= now() AND NOT ql.limited AND coalesce(al.free, 1) > 0
              AND CASE WHEN cardinality(fk.keys) > 0 AND j.concurrency_key IS NOT NULL
                       THEN chr(30) || j.actor || chr(31) || j.concurrency_key <> ALL(fk.keys) ELSE true END
            ORDER BY j.priority, j.fair_tag NULLS FIRST, j.scheduled_at, j.id
            LIMIT p_scan
            FOR UPDATE OF j SKIP LOCKED
        ) AS c
    ), ranked AS (
        SELECT c.*,
               row_number() OVER (PARTITION BY c.queue ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id) AS queue_n,
               row_number() OVER (PARTITION BY c.actor ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id) AS actor_n,
               row_number() OVER (PARTITION BY c.queue, c.concurrency_key ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id)
                   AS queue_key_n,
               row_number() OVER (PARTITION BY c.actor, c.concurrency_key ORDER BY c.priority, c.fair_tag NULLS FIRST, c.scheduled_at, c.id)
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
        ORDER BY r.priority, r.fair_tag NULLS FIRST, r.scheduled_at, r.id
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
