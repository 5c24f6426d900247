-- taskq schema, version 14: taskq.jobs is vacuumed after a fixed number of dead rows, whatever its
-- size (issue 19: history must not slow the hot path).
--
-- Every claim reads jobs_claim_idx from its oldest entry. A job claimed since the table was last vacuumed
-- leaves a dead entry there (its row left the index's predicate), ahead of every waiting job, and every
-- claim walks past it: 60,000 claimed jobs made a claim of one waiting job read 586 index and heap
-- buffers instead of 18, and take 2.2 ms instead of 0.7 (benchmarks/README.md, session 7). PostgreSQL
-- vacuums a table after 50 + 20 % of its rows are dead: about once a minute under load on a small table,
-- but with 5,000,000 finished jobs kept only after 1,000,000 dead rows, so the claim's walk grew with the
-- history (enqueue -> start +15-20 % at 5M). A fixed threshold keeps it as short as on a small table.
--
-- vacuum_index_cleanup = on: with few dead rows in a big table PostgreSQL may skip the index pass (when
-- they sit on under 2 % of its pages), and the index pass is what removes the claim's dead entries.
-- Each vacuum then reads every index of jobs once; autovacuum_naptime (1 min by default) spaces them.
ALTER TABLE taskq.jobs SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 10000,
    vacuum_index_cleanup = on
);
