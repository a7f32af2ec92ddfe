-- Whether schema $1's retry index exists and is valid (NULL: missing; false: a build that
-- did not finish, to be dropped and built again).
SELECT i.indisvalid
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = 'outbox_events_retry_idx'
