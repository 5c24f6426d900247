-- taskq schema, version 13: retention of the web API's idempotency receipts and operator audit rows
-- (issue 20). The indexes they are pruned by exist since migration 7 (operator_requests_created_idx,
-- operator_audit_at_idx); this adds the two delete halves of their prune batches.

-- As delete_terminal_jobs (migration 5): the worker role, which prunes, has no DELETE on these tables
-- (the audit is appended to, never rewritten, by the roles that write it). The prune statements
-- (sql/worker.sql: prune_receipts, prune_audit) choose a bounded, index-backed batch; these owner
-- functions delete only rows of that batch older than the window they are given (at least one hour for
-- the audit, so a worker's mistake or a short test window cannot empty the audit of the last hour).
CREATE FUNCTION taskq.delete_operator_requests(p_principals text[], p_keys text[], p_keep float8,
                                               OUT receipts bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.operator_requests AS r
        USING unnest(p_principals, p_keys) AS d(principal, key)
        WHERE r.principal = d.principal AND r.key = d.key
          AND r.created_at < now() - p_keep * interval '1 second'
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
CREATE FUNCTION taskq.delete_operator_audit(p_ids bigint[], p_keep float8, OUT audit bigint)
    LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$
    WITH gone AS (
        DELETE FROM taskq.operator_audit AS a
        WHERE a.id = ANY(p_ids) AND a.at < now() - greatest(p_keep, 3600) * interval '1 second'
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
REVOKE ALL ON FUNCTION taskq.delete_operator_requests(text[], text[], float8) FROM PUBLIC;
REVOKE ALL ON FUNCTION taskq.delete_operator_audit(bigint[], float8) FROM PUBLIC;
