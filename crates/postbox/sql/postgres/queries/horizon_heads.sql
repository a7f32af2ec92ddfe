-- The heads of the schemas $1 (in order) that are not $2 (the heads the caller last read, in the
-- same order; NULL: none yet): each outbox table's last id its identity sequence handed out,
-- read without touching the table (one buffer each), 0 before the sequence's first use, NULL
-- where there is no such table. Rows: the schema's place in $1 (from 1) and its head; only the
-- heads that moved come back, so an idle relay reading thousands decodes none.
SELECT s.n, h.head
FROM unnest($1::text[], $2::bigint[]) WITH ORDINALITY AS s(name, last, n),
     LATERAL (SELECT to_regclass(quote_ident(s.name) || '.outbox_events_id_seq') AS seq) AS q,
     LATERAL (SELECT CASE WHEN q.seq IS NULL THEN NULL
                          ELSE coalesce(pg_sequence_last_value(q.seq), 0) END AS head) AS h
WHERE h.head IS DISTINCT FROM s.last
ORDER BY s.n
