-- Whether the publication $1 exists, and whether it holds the outbox table of schema $2.
SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1) AS exists,
       EXISTS (SELECT 1 FROM pg_publication_tables
               WHERE pubname = $1 AND schemaname = $2 AND tablename = 'outbox_events') AS holds
