-- ?1 ids (JSON array), ?2 claim token, ?3 lease in ms
UPDATE outbox_events
SET locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds', ?3 / 1000.0)),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (SELECT value FROM json_each(?1)) AND claim_token = ?2 AND status = 'PROCESSING'
