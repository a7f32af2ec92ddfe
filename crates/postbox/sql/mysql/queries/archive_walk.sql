-- One batch of retention's walk in id order from ? (at most ? rows): whether each row is younger
-- than the age limit (? µs; the walk stops at the first young one) and whether it is PROCESSED.
-- Binds: age µs, after id, batch size.
SELECT id, created_at >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AS young,
       status = 'PROCESSED' AS processed
FROM outbox_events
WHERE id > ?
ORDER BY id
LIMIT ?
