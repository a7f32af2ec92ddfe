-- Age in seconds of the oldest open transaction of this database but this session's. Only
-- transactions that hold a snapshot (backend_xmin) keep vacuum from working.
SELECT EXTRACT(EPOCH FROM now() - min(xact_start))::float8
FROM pg_stat_activity
WHERE datname = current_database() AND backend_xmin IS NOT NULL
  AND pid <> pg_backend_pid()
