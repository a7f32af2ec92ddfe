-- One batch (? rows) of archived events older than ? µs deleted, oldest first.
-- Binds: age µs, batch size.
DELETE FROM outbox_events_archive
WHERE archived_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY archived_at
LIMIT ?
