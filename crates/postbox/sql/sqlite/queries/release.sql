-- An event whose destination was down: back to PENDING after a delay, without spending a try.
-- ?1 id, ?2 reason, ?3 delay in ms, ?4 claim token.
UPDATE outbox_events
SET status       = 'PENDING',
    locked_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds', ?3 / 1000.0)),
    last_error   = ?2,
    updated_at   = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id = ?1 AND claim_token = ?4 AND status = 'PROCESSING'
