-- One batch of FAILED events whose last try is older than ? µs deleted, oldest first.
-- Binds: age µs, batch size.
DELETE FROM outbox_events
WHERE updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND status = 'FAILED'
ORDER BY updated_at
LIMIT ?
