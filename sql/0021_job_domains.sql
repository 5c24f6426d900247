-- taskq schema, version 21: taskq.jobs's single-column checks as domain types (issue 34).
--
-- PostgreSQL prepares a table's check constraints again for every statement that writes the table: each check
-- expression is read from its stored form, planned and compiled, whichever columns the statement writes. On a
-- one-row statement that is most of the checks' cost: measured on copies of taskq.jobs (benchmarks/
-- enqueue_anatomy.py, 2-vCPU VM, PostgreSQL 18) the 25 checks cost about 150 µs of every one-row insert or
-- update, the single enqueue and the one-job claim and finish, and about 3 µs per row of a 100-row statement.
-- A domain's checks are planned once per session (its type cache entry) and run only for the columns a
-- statement writes. So each check over a single column moves onto a domain type of that column, with the same
-- constraint name (an error still names it: `value for domain taskq.jobs_queue violates check constraint
-- "jobs_queue_check"`); the six checks over several columns stay on the table. Copies measured: a one-row
-- insert 500 -> 310 µs, a one-row claim-like update 380 -> 227 µs.
--
-- Clients see no difference: a domain column is sent to them as its base type (text, integer, ...), and a
-- value is written to it from its base type implicitly. A statement that writes a parameter to such a column
-- and compares the same parameter as text elsewhere casts it (`%(queue)s::text`), so that the parameter has
-- one type.
--
-- Without a rewrite or a scan of taskq.jobs: each domain is created without its check, the column retyped to
-- it (a domain without a check over the column's own type needs neither), then the check added NOT VALID:
-- every row the table holds was checked by the table's constraint of the same meaning, dropped here in the
-- same transaction, and every value written from now on is checked by the domain (jobs_status_check was
-- already NOT VALID on the table). The multi-column checks that name a retyped column are re-added by
-- PostgreSQL with the new column types. The triggers whose WHEN names a retyped column (status, claim_epoch)
-- are dropped and created again unchanged: PostgreSQL does not retype a column a trigger's definition uses.

DROP TRIGGER jobs_lease_taken ON taskq.jobs;
DROP TRIGGER jobs_lease_deleted ON taskq.jobs;
DROP TRIGGER jobs_note_settled ON taskq.jobs;

ALTER TABLE taskq.jobs
    DROP CONSTRAINT jobs_actor_check,
    DROP CONSTRAINT jobs_attempt_check,
    DROP CONSTRAINT jobs_cancel_phase_check,
    DROP CONSTRAINT jobs_claim_epoch_check,
    DROP CONSTRAINT jobs_concurrency_key_length,
    DROP CONSTRAINT jobs_dependency_mode_known,
    DROP CONSTRAINT jobs_fairness_key_text,
    DROP CONSTRAINT jobs_interrupt_count_check,
    DROP CONSTRAINT jobs_max_attempts_check,
    DROP CONSTRAINT jobs_parents_remaining_positive,
    DROP CONSTRAINT jobs_queue_check,
    DROP CONSTRAINT jobs_requeue_count_positive,
    DROP CONSTRAINT jobs_revision_check,
    DROP CONSTRAINT jobs_snooze_count_check,
    DROP CONSTRAINT jobs_status_check,
    DROP CONSTRAINT jobs_unique_key_text,
    DROP CONSTRAINT jobs_unique_scope_known,
    DROP CONSTRAINT jobs_wait_kind_known,
    DROP CONSTRAINT jobs_wait_signal_text;

CREATE DOMAIN taskq.jobs_actor AS text;
CREATE DOMAIN taskq.jobs_attempt AS integer;
CREATE DOMAIN taskq.jobs_cancel_phase AS smallint;
CREATE DOMAIN taskq.jobs_claim_epoch AS bigint;
CREATE DOMAIN taskq.jobs_concurrency_key AS text;
CREATE DOMAIN taskq.jobs_dependency_mode AS text;
CREATE DOMAIN taskq.jobs_fairness_key AS text;
CREATE DOMAIN taskq.jobs_interrupt_count AS integer;
CREATE DOMAIN taskq.jobs_max_attempts AS integer;
CREATE DOMAIN taskq.jobs_parents_remaining AS integer;
CREATE DOMAIN taskq.jobs_queue AS text;
CREATE DOMAIN taskq.jobs_requeue_count AS integer;
CREATE DOMAIN taskq.jobs_revision AS bigint;
CREATE DOMAIN taskq.jobs_snooze_count AS integer;
CREATE DOMAIN taskq.jobs_status AS text;
CREATE DOMAIN taskq.jobs_unique_key AS text;
CREATE DOMAIN taskq.jobs_unique_scope AS text;
CREATE DOMAIN taskq.jobs_wait_kind AS text;
CREATE DOMAIN taskq.jobs_wait_signal AS text;

ALTER TABLE taskq.jobs
    ALTER COLUMN actor TYPE taskq.jobs_actor,
    ALTER COLUMN attempt TYPE taskq.jobs_attempt,
    ALTER COLUMN cancel_phase TYPE taskq.jobs_cancel_phase,
    ALTER COLUMN claim_epoch TYPE taskq.jobs_claim_epoch,
    ALTER COLUMN concurrency_key TYPE taskq.jobs_concurrency_key,
    ALTER COLUMN dependency_mode TYPE taskq.jobs_dependency_mode,
    ALTER COLUMN fairness_key TYPE taskq.jobs_fairness_key,
    ALTER COLUMN interrupt_count TYPE taskq.jobs_interrupt_count,
    ALTER COLUMN max_attempts TYPE taskq.jobs_max_attempts,
    ALTER COLUMN parents_remaining TYPE taskq.jobs_parents_remaining,
    ALTER COLUMN queue TYPE taskq.jobs_queue,
    ALTER COLUMN requeue_count TYPE taskq.jobs_requeue_count,
    ALTER COLUMN revision TYPE taskq.jobs_revision,
    ALTER COLUMN snooze_count TYPE taskq.jobs_snooze_count,
    ALTER COLUMN status TYPE taskq.jobs_status,
    -- the unique index compares keys bytewise (sql/0005): the column keeps its collation
    ALTER COLUMN unique_key TYPE taskq.jobs_unique_key COLLATE "C",
    ALTER COLUMN unique_scope TYPE taskq.jobs_unique_scope,
    ALTER COLUMN wait_kind TYPE taskq.jobs_wait_kind,
    ALTER COLUMN wait_signal TYPE taskq.jobs_wait_signal;

ALTER DOMAIN taskq.jobs_actor ADD CONSTRAINT jobs_actor_check
    CHECK (VALUE <> '' AND length(VALUE) <= 255) NOT VALID;
ALTER DOMAIN taskq.jobs_attempt ADD CONSTRAINT jobs_attempt_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_cancel_phase ADD CONSTRAINT jobs_cancel_phase_check
    CHECK (VALUE >= 0 AND VALUE <= 2) NOT VALID;
ALTER DOMAIN taskq.jobs_claim_epoch ADD CONSTRAINT jobs_claim_epoch_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_concurrency_key ADD CONSTRAINT jobs_concurrency_key_length
    CHECK (VALUE <> '' AND length(VALUE) <= 255) NOT VALID;
ALTER DOMAIN taskq.jobs_dependency_mode ADD CONSTRAINT jobs_dependency_mode_known
    CHECK (VALUE IN ('on_success', 'on_any_terminal')) NOT VALID;
ALTER DOMAIN taskq.jobs_fairness_key ADD CONSTRAINT jobs_fairness_key_text
    CHECK (VALUE <> '' AND length(VALUE) <= 200 AND VALUE !~ '[[:cntrl:]]') NOT VALID;
ALTER DOMAIN taskq.jobs_interrupt_count ADD CONSTRAINT jobs_interrupt_count_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_max_attempts ADD CONSTRAINT jobs_max_attempts_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN taskq.jobs_parents_remaining ADD CONSTRAINT jobs_parents_remaining_positive
    CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_queue ADD CONSTRAINT jobs_queue_check
    CHECK (VALUE <> '' AND length(VALUE) <= 255) NOT VALID;
ALTER DOMAIN taskq.jobs_requeue_count ADD CONSTRAINT jobs_requeue_count_positive CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_revision ADD CONSTRAINT jobs_revision_check CHECK (VALUE >= 1) NOT VALID;
ALTER DOMAIN taskq.jobs_snooze_count ADD CONSTRAINT jobs_snooze_count_check CHECK (VALUE >= 0) NOT VALID;
ALTER DOMAIN taskq.jobs_status ADD CONSTRAINT jobs_status_check
    CHECK (VALUE IN ('pending', 'scheduled', 'running', 'awaiting_parents', 'succeeded', 'failed', 'cancelled',
                     'crashed', 'abandoned')) NOT VALID;
ALTER DOMAIN taskq.jobs_unique_key ADD CONSTRAINT jobs_unique_key_text
    CHECK (VALUE <> '' AND length(VALUE) <= 255) NOT VALID;
ALTER DOMAIN taskq.jobs_unique_scope ADD CONSTRAINT jobs_unique_scope_known
    CHECK (VALUE IN ('active', 'retained')) NOT VALID;
ALTER DOMAIN taskq.jobs_wait_kind ADD CONSTRAINT jobs_wait_kind_known CHECK (VALUE IN ('sleep', 'signal')) NOT VALID;
ALTER DOMAIN taskq.jobs_wait_signal ADD CONSTRAINT jobs_wait_signal_text
    CHECK (VALUE <> '' AND length(VALUE) <= 200 AND VALUE !~ '[[:cntrl:]]') NOT VALID;

-- the triggers of sql/0004_pooled_worker_identity.sql and sql/0011_dependency_chunks.sql, unchanged
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
CREATE TRIGGER jobs_note_settled BEFORE UPDATE OF status ON taskq.jobs FOR EACH ROW
    WHEN (NEW.has_dependents
          AND NEW.status IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND OLD.status NOT IN ('succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')
          AND current_setting('taskq.settling', true) IS DISTINCT FROM 'on')
    EXECUTE FUNCTION taskq.note_settled();

-- The limited claims return their rows through PL/pgSQL's RETURN QUERY, which takes a column only of the exact
-- type the function's result declares: a domain where it says text is an error ("structure of query does not
-- match function result type"). Their result stays as declared (text, integer, bigint): the one select list
-- that feeds it casts the retyped columns, and nothing else of them changes. They are changed in place, under
-- their names, against the _vN rule (tests/unit/test_migration_rules.py) and for the rule's own reason: the
-- workers of the previous release call them during a rolling upgrade, and must go on claiming. The text each
-- function has is edited (its definition as the catalog holds it, the list replaced once, or the migration
-- fails), so that the function is otherwise exactly the one its migration created.
DO $do$
DECLARE
    v_fn regprocedure;
    v_def text;
    v_list constant text := 'SELECT c.id, c.actor, c.queue, c.payload, c.attempt, c.max_attempts, c.claim_epoch, ';
    v_cast constant text := 'SELECT c.id, c.actor::text, c.queue::text, c.payload, c.attempt::integer, '
                            'c.max_attempts::integer, c.claim_epoch::bigint, ';
BEGIN
    FOREACH v_fn IN ARRAY ARRAY[
        'taskq.job_claim_queue_limited(text[], integer, text, double precision)',
        'taskq.job_claim_limited(text[], integer, integer, text, double precision)',
        'taskq.job_claim_queue_limited_v16(text[], integer, text, double precision, text[], text[])',
        'taskq.job_claim_limited_v16(text[], integer, integer, text, double precision, text[], text[])'
    ]::regprocedure[] LOOP
        v_def := pg_get_functiondef(v_fn);
        IF array_length(string_to_array(v_def, v_list), 1) <> 2 THEN
            RAISE EXCEPTION 'taskq migration 21: % does not have its result list once', v_fn;
        END IF;
        EXECUTE replace(v_def, v_list, v_cast);
    END LOOP;
END
$do$;
