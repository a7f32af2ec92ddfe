-- The logical replication slots of this database (a CDC relay's), with the WAL each holds back:
-- from its confirmed position to the server's current one. `postbox status` and the admin page.
SELECT slot_name::text,
       active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint,
       wal_status,
       safe_wal_size
FROM pg_replication_slots
WHERE database = current_database()
  AND slot_type = 'logical'
ORDER BY slot_name
