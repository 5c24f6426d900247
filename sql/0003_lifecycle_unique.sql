-- taskq schema, version 3: unique (idempotent) enqueue and operator requeue.
--
-- unique_key / unique_scope: a producer-chosen (or payload-derived) key. One partial unique index
-- enforces both scopes, with a constant predicate (no function runs on an index update):
--   * every pending, scheduled or running row with a key is in it, whatever its scope: at most one
--     live job per key, so a retry, a release or a snooze (all between live states) never conflicts;
--   * a row of scope 'retained' stays in it in every status, until it is deleted: a key held by a
--     retained row is taken for every later enqueue of that key, whatever the later call's scope.
-- A terminal row of scope 'active' leaves the index and frees its key.
-- The key is compared byte for byte (COLLATE "C"): the same uniqueness as any deterministic collation,
-- without a locale's comparison cost on every index probe.
-- requeue_count: how many times an operator put the row back to pending (each has a 'requeued' event).

ALTER TABLE taskq.jobs
    ADD COLUMN unique_key    text COLLATE "C"
        CONSTRAINT jobs_unique_key_text CHECK (unique_key <> '' AND length(unique_key) <= 255),
    ADD COLUMN unique_scope  text
        CONSTRAINT jobs_unique_scope_known CHECK (unique_scope IN ('active', 'retained')),
    ADD COLUMN requeue_count integer NOT NULL DEFAULT 0 CONSTRAINT jobs_requeue_count_positive CHECK (requeue_count >= 0),
    ADD CONSTRAINT jobs_unique_scope_with_key CHECK ((unique_key IS NULL) = (unique_scope IS NULL));

CREATE UNIQUE INDEX jobs_unique_key_idx ON taskq.jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND (unique_scope = 'retained' OR status IN ('pending', 'scheduled', 'running'));

-- the timeline learns the operator's requeue ('snoozed' is listed too, for the snooze of the same issue,
-- so that neither migration has to know the other's kinds)
ALTER TABLE taskq.job_events DROP CONSTRAINT job_events_kind_check;
ALTER TABLE taskq.job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'state_change', 'cancel_requested', 'progress', 'note', 'requeued', 'snoozed'));
