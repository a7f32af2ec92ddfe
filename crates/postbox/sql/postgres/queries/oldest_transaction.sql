-- Age in seconds of the oldest open transaction of this database but this session's that holds
-- vacuum back: one with a snapshot (backend_xmin: a report, a pg_dump) or one that wrote
-- (backend_xid: a producer's transaction left open, whose rows nobody can vacuum past).
SELECT EXTRACT(EPOCH FROM now() - min(xact_start))::float8
FROM pg_stat_activity
WHERE datname = current_database()
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
  AND pid <> pg_backend_pid()
