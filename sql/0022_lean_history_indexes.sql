-- taskq schema, version 22: three fewer index entries for every job a worker runs, 12 instead of 15 (issue 34).
--
-- A job on its way through a worker writes one job_attempts row (at the claim, finished by the finish) and two
-- job_events rows (running, then its end). Two of the indexes those rows went into served no query:
-- - job_attempts_open_idx, a worker's unfinished attempts (worker_id WHERE finished_at IS NULL), from schema 1:
--   no statement reads attempts by worker (the sweeper and the finish find an attempt by its key, job_id and
--   claim_epoch; a worker's held jobs are found in taskq.jobs). Every claim wrote an entry into it.
-- - job_events had its primary key on id and a second index on (job_id, id): every query reads a job's events by
--   job_id (its timeline, the dashboard's page of it, the invariants, retention's delete), none an event by id
--   alone. The primary key becomes (job_id, id) and the second index goes; id stays an identity column, in
--   commit order for each job as before.
-- Measured on drains before and after in one run (benchmarks/defaults.py, 10 rounds): PostgreSQL's CPU per job
-- 6-10 % less in three of four cases (defaults and concurrency 500, 1 and 2 workers), its WAL per job 7 % less.
--
-- The new key's index is built in this migration's transaction: job_events is locked against writes (workers'
-- claims and finishes wait) while it is built over the rows it holds: 0.7 s per million rows on a 2-vCPU VM
-- (docs/deploy.md).

DROP INDEX taskq.job_attempts_open_idx;
ALTER TABLE taskq.job_events DROP CONSTRAINT job_events_pkey;
ALTER TABLE taskq.job_events ADD CONSTRAINT job_events_pkey PRIMARY KEY (job_id, id);
DROP INDEX taskq.job_events_job_idx;
