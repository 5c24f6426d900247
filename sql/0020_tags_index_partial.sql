-- taskq schema, version 20: the tags index holds tagged jobs only (issue 34).
--
-- jobs_tags_idx was a GIN index over every row's tags. A row gets a new entry in it at its insert and at every
-- update that is not HOT, and no update of a job is HOT (each changes status, which the partial indexes test):
-- so a job without tags paid three GIN insertions (enqueue, claim, finish) for an index that can never find
-- it. Measured on a 1-worker drain at the defaults (benchmarks/statements.py, PostgreSQL 15): 2 µs of the
-- claim and 2-3 µs of the finish per job, and about 12 % of their WAL.
--
-- The filters on tags (`tags @> $1`, $1 never empty: an empty filter is no filter) add `tags <> '{}'`, which
-- the containment already implies and which lets the planner prove this predicate and use the index.
--
-- Rebuilt in this migration's transaction: the jobs table is locked against writes while the index over its
-- tagged rows is built (docs/deploy.md).

DROP INDEX taskq.jobs_tags_idx;
CREATE INDEX jobs_tags_idx ON taskq.jobs USING gin (tags) WHERE tags <> '{}'::text[];
