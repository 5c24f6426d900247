-- taskq schema, version 4: a worker's identity that survives a transaction pooler.
--
-- Schema 2 had a worker name itself in the session setting taskq.worker_id, passed as a startup
-- option; PgBouncer refuses startup options ("unsupported startup parameter: options"). A worker now
-- also sets application_name to 'taskq-worker <id>', which PgBouncer sets again on whichever server
-- connection runs each transaction. The lease-loss triggers accept either: the setting when present
-- (a direct connection, or a worker of an older taskq during a rolling upgrade), else the name.

DROP TRIGGER jobs_lease_taken ON taskq.jobs;
DROP TRIGGER jobs_lease_deleted ON taskq.jobs;

-- The WHEN clauses are still evaluated without calling the function, and the identity only for a
-- running row whose holder changes: the claims and cancel requests of normal operation never get there.
CREATE TRIGGER jobs_lease_taken AFTER UPDATE ON taskq.jobs FOR EACH ROW
    WHEN (OLD.status = 'running'
          AND (NEW.status, NEW.worker_id, NEW.claim_epoch) IS DISTINCT FROM
              (OLD.status, OLD.worker_id, OLD.claim_epoch)
          AND OLD.worker_id IS DISTINCT FROM coalesce(
              nullif(current_setting('taskq.worker_id', true), ''),
              CASE WHEN starts_with(current_setting('application_name'), 'taskq-worker ')
                   THEN substr(current_setting('application_name'), 14) END))
    EXECUTE FUNCTION taskq.record_lease_loss();
CREATE TRIGGER jobs_lease_deleted AFTER DELETE ON taskq.jobs FOR EACH ROW
    WHEN (OLD.status = 'running'
          AND OLD.worker_id IS DISTINCT FROM coalesce(
              nullif(current_setting('taskq.worker_id', true), ''),
              CASE WHEN starts_with(current_setting('application_name'), 'taskq-worker ')
                   THEN substr(current_setting('application_name'), 14) END))
    EXECUTE FUNCTION taskq.record_lease_loss();
