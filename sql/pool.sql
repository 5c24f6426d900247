-- Statements of the bounded pools (taskq.backend.bounded): every connection of such a pool runs inside
-- one transaction from the moment it is taken until it is given back.

-- name: bounded_tx_begin
-- SET LOCAL holds for this transaction only: through a transaction pooler (PgBouncer) the limits apply to
-- whichever server connection runs it and are gone when it ends, so they never reach another client.
BEGIN;
SET LOCAL statement_timeout = {statement_ms};
SET LOCAL idle_in_transaction_session_timeout = {idle_ms};
