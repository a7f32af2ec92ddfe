-- The logical replication slots of this database (a CDC relay's), with the WAL each holds back
-- from its confirmed position to the server's current one (lag), the WAL the server keeps for it
-- (from restart_lsn: decoding restarts there, and it cannot pass a transaction that was open
-- when the slot last moved), and, when what it keeps trails its confirmed position by more than
-- 16 MiB, the open transaction with the oldest xid (of any database: the WAL is the cluster's),
-- which is what holds restart_lsn back. `postbox status`, the admin page and the CDC relay's lag
-- check.
SELECT s.slot_name::text,
       s.active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint,
       s.wal_status,
       s.safe_wal_size,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint,
       pin.pid,
       pin.datname::text,
       pin.usename::text,
       pin.application_name,
       EXTRACT(EPOCH FROM now() - pin.xact_start)::float8,
       pin.state,
       left(pin.query, 200)
FROM pg_replication_slots s
LEFT JOIN LATERAL (
    SELECT a.pid, a.datname, a.usename, a.application_name, a.xact_start, a.state, a.query
    FROM pg_stat_activity a
    WHERE a.backend_xid IS NOT NULL
      AND a.pid <> pg_backend_pid()
      AND pg_wal_lsn_diff(s.confirmed_flush_lsn, s.restart_lsn) > 16 * 1024 * 1024
    ORDER BY age(a.backend_xid) DESC
    LIMIT 1
) pin ON true
WHERE s.database = current_database()
  AND s.slot_type = 'logical'
ORDER BY s.slot_name
