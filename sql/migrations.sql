-- The migration runner's statements (taskq.backend.migrations) and the schema version check. Parameters are psycopg %(name)s.

-- name: migrations_bootstrap
CREATE SCHEMA IF NOT EXISTS taskq;
CREATE TABLE IF NOT EXISTS taskq.schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    checksum   text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- name: migrations_lock
SELECT pg_advisory_xact_lock(%(key)s);

-- name: migrations_applied
SELECT version, name, checksum FROM taskq.schema_migrations ORDER BY version;

-- name: migrations_record
INSERT INTO taskq.schema_migrations (version, name, checksum) VALUES (%(version)s, %(name)s, %(checksum)s);

-- name: schema_version
SELECT coalesce(max(version), 0) AS version FROM taskq.schema_migrations;
