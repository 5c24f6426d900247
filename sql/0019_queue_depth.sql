-- taskq schema, version 19: the depth of a queue group, one number for an autoscaler, and each worker's clock
-- as its heartbeats report it (issue 33).
--
-- queue_depth_v19(queues) = the due jobs (pending or scheduled with scheduled_at <= now()) plus the running
-- jobs of `queues` (NULL: every queue), the jobs of paused queues left out. It is what a KEDA PostgreSQL
-- scaler divides by the jobs one pod runs at once (docs/kubernetes.md). Counting running jobs keeps a pod
-- while it works: a scale-down only stops pods once their work is done or released. Jobs scheduled later,
-- awaiting their parents, or suspended until a signal are not due and not counted.
--
-- Never NULL (KEDA scans the value into a float, and a NULL fails the scaler). Two counts over partial
-- indexes: jobs_claim_idx or jobs_claim_actor_idx (their predicate holds only pending and scheduled jobs) for
-- the due jobs, jobs_running_scope_idx or jobs_running_lease_idx (running jobs only) for the running ones.
-- Finished history, however long, is never read: tests/integration/test_queue_depth.py checks the plans and
-- prints them with EXPLAIN (ANALYZE, BUFFERS) at 1,000,000 finished jobs (docs/kubernetes.md has the figures).
--
-- SECURITY DEFINER, EXECUTE revoked from PUBLIC: a role granted only this function (sql/roles.sql,
-- monitor_role) learns a count and nothing of the jobs' payloads.

CREATE FUNCTION taskq.queue_depth_v19(queues text[] DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog AS $$
DECLARE
    paused text[] := ARRAY(SELECT q.name FROM taskq.queues AS q WHERE q.paused_at IS NOT NULL);
BEGIN
    -- two statements rather than `queues IS NULL OR queue = ANY (queues)`, which would keep the planner
    -- from using the queue column of the indexes
    IF queues IS NULL THEN
        RETURN (SELECT count(*) FROM taskq.jobs AS j
                WHERE j.status IN ('pending', 'scheduled') AND j.scheduled_at <= now() AND j.queue <> ALL (paused))
             + (SELECT count(*) FROM taskq.jobs AS j WHERE j.status = 'running' AND j.queue <> ALL (paused));
    END IF;
    RETURN (SELECT count(*) FROM taskq.jobs AS j
            WHERE j.status IN ('pending', 'scheduled') AND j.scheduled_at <= now() AND j.queue = ANY (queues)
              AND j.queue <> ALL (paused))
         + (SELECT count(*) FROM taskq.jobs AS j
            WHERE j.status = 'running' AND j.queue = ANY (queues) AND j.queue <> ALL (paused));
END
$$;

REVOKE ALL ON FUNCTION taskq.queue_depth_v19(text[]) FROM PUBLIC;

-- Each worker's clock against the database's, as its last heartbeat saw it: the seconds its clock was ahead
-- (negative: behind) when it sent the heartbeat, less the trip to the server (so a skew is known to a few
-- milliseconds). `taskq doctor` reports the worst of the live workers. NULL until a heartbeat of a taskq
-- that writes it.
ALTER TABLE taskq.workers ADD COLUMN clock_offset float8;
