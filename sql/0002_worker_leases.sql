-- taskq schema, version 2: one lease per worker instead of one per job, so that a heartbeat tick
-- costs the same whether its worker holds ten jobs or ten thousand.
--
-- A running row is held while its own lock (jobs.lock_expires_at, set at the claim) or its worker's
-- lease (workers.lease_expires_at, renewed by every heartbeat tick) is in the future. A sweeper reclaims
-- a row only when both have passed. The heartbeat no longer writes the job rows; what it still has to
-- learn about them, that another party took one away, the trigger below records in lease_losses.

ALTER TABLE taskq.workers
    ADD COLUMN lease_expires_at timestamptz NOT NULL DEFAULT now();

-- Rows taken away from a worker that did not write the change itself (a sweeper or the supervisor
-- reclaimed them, or someone rewrote them by hand). The worker's heartbeat reads and deletes its own
-- entries every tick and stops those attempts without writing: the flat replacement for comparing
-- every held row on every tick.
CREATE TABLE taskq.lease_losses (
    worker_id   text        NOT NULL,
    job_id      uuid        NOT NULL,
    claim_epoch bigint      NOT NULL,
    lost_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX lease_losses_worker_idx ON taskq.lease_losses (worker_id);

-- A worker names itself in the session setting taskq.worker_id (a connection option), so its own
-- writes (finish, retry, release) are told apart from a change made by anyone else. Without the
-- setting every change looks foreign: a few wasted rows, never a missed loss.
CREATE FUNCTION taskq.record_lease_loss() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    INSERT INTO taskq.lease_losses (worker_id, job_id, claim_epoch)
    VALUES (OLD.worker_id, OLD.id, OLD.claim_epoch);
    RETURN NULL;
END $$;

-- The WHEN clauses are evaluated without calling the function: the claims, finishes and cancel
-- requests of normal operation never reach it.
CREATE TRIGGER jobs_lease_taken AFTER UPDATE ON taskq.jobs FOR EACH ROW
    WHEN (OLD.status = 'running'
          AND (NEW.status, NEW.worker_id, NEW.claim_epoch) IS DISTINCT FROM
              (OLD.status, OLD.worker_id, OLD.claim_epoch)
          AND OLD.worker_id IS DISTINCT FROM current_setting('taskq.worker_id', true))
    EXECUTE FUNCTION taskq.record_lease_loss();
CREATE TRIGGER jobs_lease_deleted AFTER DELETE ON taskq.jobs FOR EACH ROW
    WHEN (OLD.status = 'running' AND OLD.worker_id IS DISTINCT FROM current_setting('taskq.worker_id', true))
    EXECUTE FUNCTION taskq.record_lease_loss();

-- The heartbeat's cancel poll: only the held rows with a cancel request, found without visiting the
-- others. (Setting cancel_requested_at on a running row is now a non-HOT update; it happens once.)
CREATE INDEX jobs_cancel_held_idx ON taskq.jobs (worker_id)
    WHERE status = 'running' AND cancel_requested_at IS NOT NULL;
