-- Whether a CDC relay reads this schema's outbox from a logical replication slot now: for the
-- most advanced active slot recorded in postbox_cdc_slots (a reader holds it), its confirmed
-- position and the server's WAL position (bytes from 0/0), and the schemas whose outbox table a
-- publication holds (the CDC relay adds its active tenants' tables to its publication); no row
-- when none is read.
SELECT pg_catalog.pg_wal_lsn_diff(s.confirmed_flush_lsn, '0/0')::bigint AS confirmed,
       pg_catalog.pg_wal_lsn_diff(pg_catalog.pg_current_wal_lsn(), '0/0')::bigint AS wal,
       coalesce((SELECT array_agg(DISTINCT p.schemaname::text)
                 FROM pg_catalog.pg_publication_tables p
                 WHERE p.tablename = 'outbox_events'), '{}') AS published
FROM {schema}.postbox_cdc_slots c
JOIN pg_catalog.pg_replication_slots s ON s.slot_name = c.slot_name
WHERE s.database = pg_catalog.current_database()
  AND s.slot_type = 'logical'
  AND s.active
ORDER BY s.confirmed_flush_lsn DESC
LIMIT 1
