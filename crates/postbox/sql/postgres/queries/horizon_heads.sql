-- The head of each schema's ($1, in order) outbox table: the last id its identity sequence
-- handed out, read without touching the table (one buffer each); 0 before the sequence's first
-- use, NULL where there is no such table.
SELECT CASE WHEN q.seq IS NULL THEN NULL
            ELSE coalesce(pg_sequence_last_value(q.seq), 0) END
FROM unnest($1::text[]) WITH ORDINALITY AS s(name, n),
     LATERAL (SELECT to_regclass(quote_ident(s.name) || '.outbox_events_id_seq') AS seq) AS q
ORDER BY s.n
