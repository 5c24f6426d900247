-- `taskq doctor` (taskq.backend.doctor): what hurts a PostgreSQL queue before it hurts. Read-only statements
-- over PostgreSQL's own views and taskq's worker registry; each is run on its own (autocommit), so that a
-- view the role may not read fails that check alone. Other sessions' transactions, xmin and query text are
-- visible only to a member of pg_read_all_stats (pg_monitor) or of the session's role: `hidden` counts the
-- sessions the checks could not see. Our own session is left out everywhere (it holds a snapshot while it
-- reads). PostgreSQL shows a hidden session's query as '<insufficient privilege>' and most of its columns as NULL.
-- Parameters are psycopg %(name)s.

-- name: doctor_server
SELECT current_setting('server_version') AS server_version,
       current_database() AS database,
       current_user AS role,
       pg_is_in_recovery() AS in_recovery,
       current_setting('default_transaction_read_only')::boolean AS read_only,
       (SELECT r.rolsuper FROM pg_roles AS r WHERE r.rolname = current_user)
           OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') AS sees_all,
       pg_backend_pid() AS backend_pid,
       current_setting('max_connections')::integer AS max_connections,
       current_setting('superuser_reserved_connections')::integer AS reserved_connections,
       (SELECT count(*) FROM pg_stat_activity AS a WHERE a.backend_type = 'client backend') AS connections,
       pg_notification_queue_usage() AS notify_queue_usage,
       current_setting('autovacuum')::boolean AS autovacuum,
       current_setting('autovacuum_freeze_max_age')::bigint AS freeze_max_age,
       current_setting('autovacuum_multixact_freeze_max_age')::bigint AS multixact_freeze_max_age;

-- name: doctor_clock
SELECT clock_timestamp() AS now;

-- name: doctor_pids
SELECT pg_backend_pid() AS pid;

-- name: doctor_oldest_transaction
-- The client session whose transaction is oldest (idle in transaction included: it holds its snapshot too).
SELECT a.pid, a.usename AS role, a.application_name, a.state, a.datname AS database,
       extract(epoch FROM now() - a.xact_start)::float8 AS age,
       left(regexp_replace(a.query, '\s+', ' ', 'g'), 120) AS query,
       (SELECT count(*) FROM pg_stat_activity AS h WHERE h.query = '<insufficient privilege>') AS hidden
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (
    SELECT * FROM pg_stat_activity AS s
    WHERE s.xact_start IS NOT NULL AND s.pid <> pg_backend_pid() AND s.backend_type = 'client backend'
    ORDER BY s.xact_start LIMIT 1
) AS a ON true;

-- name: doctor_xmin_horizon
-- What holds back the oldest xmin, the horizon below which VACUUM may remove no dead row: a session's
-- snapshot or its own open transaction's ID (backend_xmin, backend_xid: a session idle in transaction holds
-- its xid; a standby's hot_standby_feedback shows on its walsender), a prepared transaction,
-- or a replication slot (xmin, catalog_xmin). Its age is in transactions.
SELECT h.kind, h.holder, h.detail, h.xid_age, h.seconds
FROM (
    SELECT 'session' AS kind, a.pid::text AS holder,
           concat_ws(' ', a.backend_type, nullif(a.application_name, ''), a.state, a.datname) AS detail,
           greatest(age(a.backend_xmin), age(a.backend_xid))::bigint AS xid_age,
           extract(epoch FROM now() - a.xact_start)::float8 AS seconds
    FROM pg_stat_activity AS a
    WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL) AND a.pid <> pg_backend_pid()
    UNION ALL
    SELECT 'prepared transaction', p.gid, concat_ws(' ', p.owner, p.database),
           age(p.transaction)::bigint, extract(epoch FROM now() - p.prepared)::float8
    FROM pg_prepared_xacts AS p
    UNION ALL
    SELECT 'replication slot', r.slot_name, concat_ws(' ', r.slot_type, CASE WHEN r.active THEN 'active' ELSE 'inactive' END),
           greatest(age(r.xmin), age(r.catalog_xmin))::bigint, NULL
    FROM pg_replication_slots AS r WHERE r.xmin IS NOT NULL OR r.catalog_xmin IS NOT NULL
) AS h
ORDER BY h.xid_age DESC NULLS LAST
LIMIT 1;

-- name: doctor_slots
SELECT r.slot_name AS name, r.slot_type AS type, r.active,
       (r.xmin IS NOT NULL OR r.catalog_xmin IS NOT NULL) AS holds_xmin,
       greatest(age(r.xmin), age(r.catalog_xmin))::bigint AS xid_age,
       CASE WHEN pg_is_in_recovery() OR r.restart_lsn IS NULL THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), r.restart_lsn)::bigint END AS retained_wal_bytes
FROM pg_replication_slots AS r
ORDER BY r.slot_name;

-- name: doctor_tables
-- taskq's tables: their dead rows, when (auto)vacuum last ran, and the number of dead rows at which
-- autovacuum should take the table (threshold + scale factor x rows, the table's own settings first:
-- migration 14 gives taskq.jobs a fixed threshold).
SELECT s.relname AS name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       extract(epoch FROM now() - s.last_autovacuum)::float8 AS autovacuum_ago,
       extract(epoch FROM now() - greatest(s.last_autovacuum, s.last_vacuum))::float8 AS vacuum_ago,
       coalesce((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'autovacuum_enabled')::boolean, true) AS autovacuum_enabled,
       (coalesce((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                  WHERE o.option_name = 'autovacuum_vacuum_threshold')::float8,
                 current_setting('autovacuum_vacuum_threshold')::float8)
        + coalesce((SELECT o.option_value FROM pg_options_to_table(c.reloptions) AS o
                    WHERE o.option_name = 'autovacuum_vacuum_scale_factor')::float8,
                   current_setting('autovacuum_vacuum_scale_factor')::float8) * greatest(c.reltuples, 0)
       )::bigint AS vacuum_at
FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
WHERE s.schemaname = 'taskq'
ORDER BY s.relname;

-- name: doctor_xid_age
-- The database nearest to transaction-ID (or multixact) wraparound: PostgreSQL stops assigning IDs to the
-- whole cluster when one database gets too close.
SELECT d.datname AS database, age(d.datfrozenxid)::bigint AS xid_age, mxid_age(d.datminmxid)::bigint AS mxid_age
FROM pg_database AS d
ORDER BY greatest(age(d.datfrozenxid), mxid_age(d.datminmxid)) DESC
LIMIT 1;

-- name: doctor_workers
-- Live workers (registered, lease running, not stopping) against the sessions of this database that hold a
-- worker's LISTEN: named 'taskq-listener <worker id>' (taskq.backend._conn.LISTENER_APPLICATION_NAME), or,
-- from a worker of an older taskq, whose last statement is the listener's LISTEN (sql/workers.sql `listen`).
-- `named` counts the workers with at least one connection named after them (WORKER_APPLICATION_NAME).
SELECT (SELECT count(*) FROM taskq.workers AS w WHERE w.lease_expires_at > now() AND NOT w.stopping) AS alive,
       (SELECT count(*) FROM taskq.workers AS w WHERE w.lease_expires_at <= now()) AS expired,
       (SELECT count(*) FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
          AND (a.application_name LIKE 'taskq-listener %%' OR a.query LIKE 'LISTEN taskq\_jobs;%%')
       ) AS listening,
       (SELECT count(DISTINCT a.application_name) FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND a.application_name LIKE 'taskq-worker %%') AS named,
       (SELECT count(*) FROM pg_stat_activity AS a
        WHERE a.datname = current_database() AND a.query = '<insufficient privilege>') AS hidden,
       -- the live worker whose clock is furthest from the database's, as its heartbeats report it
       o.id AS skewed_worker, o.clock_offset AS worker_clock_offset
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT w.id, w.clock_offset FROM taskq.workers AS w
                   WHERE w.lease_expires_at > now() AND w.clock_offset IS NOT NULL
                   ORDER BY abs(w.clock_offset) DESC LIMIT 1) AS o ON true;
