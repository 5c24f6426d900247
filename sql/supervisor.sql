-- Queries used by the supervisor (taskq.supervisor.store). Parameters are psycopg %(name)s.

-- name: supervisor_tx_timeouts
-- Bound every wait of the current transaction (the supervisor's loop must not hang on the database).
SELECT set_config('statement_timeout', %(ms)s::text, true), set_config('lock_timeout', %(ms)s::text, true);

-- name: supervisor_ping
SELECT 1;
