-- The columns the publication $1 sends of schema $2's outbox table (PostgreSQL 15+).
SELECT attnames::text[] FROM pg_publication_tables
WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events'
