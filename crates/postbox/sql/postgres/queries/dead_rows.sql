-- Dead row versions in the outbox table of each of the schemas $1, as the statistics know them.
SELECT schemaname::text, n_dead_tup FROM pg_stat_user_tables
WHERE relname = 'outbox_events' AND schemaname = ANY($1)
