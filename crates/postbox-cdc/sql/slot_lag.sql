-- The slot $1: the WAL it holds back in bytes; the seconds its reader's confirmed position
-- trails the server (pg_stat_replication's flush_lag, while a reader is connected); its
-- wal_status; and the WAL it may still hold before max_slot_wal_keep_size invalidates it
-- (NULL: no limit).
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       extract(epoch FROM r.flush_lag)::float8 AS lag_seconds,
       s.wal_status::text AS wal_status,
       s.safe_wal_size::bigint AS safe_wal_size,
       s.active
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = $1
