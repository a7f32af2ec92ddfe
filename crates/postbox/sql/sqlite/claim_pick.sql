-- Due rows in id order; the claim runs in a BEGIN IMMEDIATE transaction, which SQLite serializes,
-- so no row can be picked twice. ?1 batch size
SELECT id, status = 'PROCESSING' AS stale
FROM outbox_events
WHERE status IN ('PENDING', 'PROCESSING')
  AND (locked_until IS NULL OR locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
ORDER BY id
LIMIT ?1
