-- Puts FAILED events back in the queue with a fresh retry budget (an operator's retry).
-- ?1 ids as a JSON array, or NULL for every FAILED event.
UPDATE outbox_events
SET status = 'PENDING', retry_count = 0, locked_until = NULL, skipped_at = NULL,
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE status = 'FAILED' AND (?1 IS NULL OR id IN (SELECT value FROM json_each(?1)))
