-- taskq schema, version 7: the HTTP operator API (issue 20): row revisions, API tokens, idempotency
-- receipts and the operator audit log.

-- A job's revision rises with every change to its row (status, cancel phase, progress, requeue): every
-- UPDATE of taskq.jobs in the named queries says `revision = revision + 1` (a test checks each one). An
-- explicit term rather than a BEFORE trigger: the claim and the batched finish stay plain statements.
-- The heartbeat does not touch job rows (leases live on the workers row), so a running job's revision
-- moves only when something about it changes. A constant default: no table rewrite.
ALTER TABLE taskq.jobs ADD COLUMN revision bigint NOT NULL DEFAULT 1 CHECK (revision >= 1);

-- Bearer tokens of the web API and dashboard (`taskq tokens create|list|revoke`). Only the SHA-256 of
-- the token is stored (tokens are 256 random bits, so a plain hash is enough: nothing to brute-force).
-- grants: 'action@queue-pattern' strings, for example 'jobs:read@*' or 'jobs:cancel@billing-*'.
CREATE TABLE taskq.api_tokens (
    name         text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$'),
    token_hash   text        NOT NULL UNIQUE,
    grants       text[]      NOT NULL CHECK (cardinality(grants) >= 1),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text,
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- Idempotency receipts: the first response to a POST carrying an Idempotency-Key, per token. A replay
-- with the same fingerprint (method, path and canonical body) gets the stored status and body; another
-- fingerprint under the same key is refused (422). Inserted first in the action's transaction, so a
-- concurrent duplicate waits on the primary key and then replays; a rolled-back action leaves no receipt.
CREATE TABLE taskq.operator_requests (
    principal   text        NOT NULL,
    key         text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    fingerprint text        NOT NULL,
    status      smallint,
    body        jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (principal, key)
);
CREATE INDEX operator_requests_created_idx ON taskq.operator_requests (created_at);

-- Every operator write through the API or the dashboard, in the transaction of the change (an action
-- that rolls back leaves no audit row). outcome: what the action decided (cancelled, cancel_requested,
-- requeued, conflict, enqueued, paused, ...).
CREATE TABLE taskq.operator_audit (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at                timestamptz NOT NULL DEFAULT now(),
    principal         text        NOT NULL,
    action            text        NOT NULL,
    outcome           text        NOT NULL,
    queue             text,
    job_id            uuid,
    schedule          text,
    reason            text,
    request_id        text,
    idempotency_key   text,
    expected_revision bigint,
    revision          bigint,
    detail            jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX operator_audit_job_idx ON taskq.operator_audit (job_id, id) WHERE job_id IS NOT NULL;
CREATE INDEX operator_audit_at_idx ON taskq.operator_audit (at);

-- the audit's entry on a job's timeline: kind 'operator' (no state change of its own; the change, if
-- any, has its own event). NOT VALID as in migration 5: existing rows passed the narrower check.
ALTER TABLE taskq.job_events DROP CONSTRAINT IF EXISTS job_events_kind_check;
ALTER TABLE taskq.job_events ADD CONSTRAINT job_events_kind_check CHECK (kind IN (
    'state_change', 'cancel_requested', 'progress', 'note', 'snoozed', 'requeued', 'operator')) NOT VALID;
