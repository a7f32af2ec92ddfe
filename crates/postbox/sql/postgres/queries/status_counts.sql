-- $1 the schema name, $2 the largest number of PROCESSED rows counted exactly (above it, they
-- are estimated). See functions/postbox_status.sql.
SELECT s.pending, s.processing, s.processed, s.failed, s.oldest_pending_age,
       -- Dead row versions left by marks, until (auto)vacuum removes them: they slow claims.
       (SELECT n_dead_tup FROM pg_stat_user_tables
        WHERE schemaname = $1 AND relname = 'outbox_events'),
       s.processed_exact
FROM {schema}.postbox_status($2::bigint) AS s
