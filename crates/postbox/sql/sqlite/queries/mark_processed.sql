-- ?1 ids (JSON array), ?2 claim token. Fenced by the claim token.
UPDATE outbox_events
SET status = 'PROCESSED', processed_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'),
    locked_until = NULL, updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (SELECT value FROM json_each(?1)) AND claim_token = ?2 AND status = 'PROCESSING'
