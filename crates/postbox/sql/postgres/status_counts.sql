SELECT count(*) FILTER (WHERE status = 'PENDING'),
       count(*) FILTER (WHERE status = 'PROCESSING'),
       count(*) FILTER (WHERE status = 'PROCESSED'),
       count(*) FILTER (WHERE status = 'FAILED'),
       EXTRACT(EPOCH FROM now() - min(created_at) FILTER (WHERE status IN ('PENDING', 'PROCESSING')))::float8,
       -- Dead row versions left by marks, until (auto)vacuum removes them: they slow claims.
       (SELECT n_dead_tup FROM pg_stat_user_tables
        WHERE schemaname = $1 AND relname = 'outbox_events')
FROM {schema}.outbox_events
