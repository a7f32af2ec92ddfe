-- The slot $1: the WAL it holds back in bytes (from its confirmed position); the seconds its
-- reader's confirmed position trails the server (pg_stat_replication's flush_lag, while a reader
-- is connected); its wal_status; the WAL it may still hold before max_slot_wal_keep_size
-- invalidates it (NULL: no limit); the WAL the server keeps for it (from restart_lsn, which
-- cannot pass a transaction open when the slot last moved); its confirmed and the server's
-- current positions; and, when it keeps more than 16 MiB beyond its confirmed position, the
-- open transaction with the oldest xid (of any database: the WAL is the cluster's), which
-- holds restart_lsn back. Its query text is not read: it may hold secrets, and this goes to the log.
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       extract(epoch FROM r.flush_lag)::float8 AS lag_seconds,
       s.wal_status::text AS wal_status,
       s.safe_wal_size::bigint AS safe_wal_size,
       s.active,
       pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::bigint AS kept_bytes,
       (s.confirmed_flush_lsn - '0/0')::bigint AS confirmed_lsn,
       (pg_current_wal_lsn() - '0/0')::bigint AS current_lsn,
       pin.pid AS pin_pid,
       pin.datname::text AS pin_database,
       pin.application_name AS pin_application,
       extract(epoch FROM now() - pin.xact_start)::float8 AS pin_age_secs
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
LEFT JOIN LATERAL (
    SELECT a.pid, a.datname, a.application_name, a.xact_start
    FROM pg_stat_activity a
    WHERE a.backend_xid IS NOT NULL
      AND a.pid <> pg_backend_pid()
      AND pg_wal_lsn_diff(s.confirmed_flush_lsn, s.restart_lsn) > 16 * 1024 * 1024
    ORDER BY age(a.backend_xid) DESC
    LIMIT 1
) pin ON true
WHERE s.slot_name = $1
