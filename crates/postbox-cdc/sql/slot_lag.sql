-- The slot $1: the WAL it holds back in bytes (from its confirmed position); the seconds its
-- reader's confirmed position trails the server (pg_stat_replication's flush_lag, while a reader
-- is connected); its wal_status; the WAL it may still hold before max_slot_wal_keep_size
-- invalidates it (NULL: no limit); and its confirmed and the server's current positions. The WAL
-- the server keeps for it, and the transaction that holds it, are the store's
-- (queries/replication_slots.sql).
SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::bigint AS lag_bytes,
       extract(epoch FROM r.flush_lag)::float8 AS lag_seconds,
       s.wal_status::text AS wal_status,
       s.safe_wal_size::bigint AS safe_wal_size,
       s.active,
       (s.confirmed_flush_lsn - '0/0')::bigint AS confirmed_lsn,
       (pg_current_wal_lsn() - '0/0')::bigint AS current_lsn
FROM pg_replication_slots s
LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
WHERE s.slot_name = $1
