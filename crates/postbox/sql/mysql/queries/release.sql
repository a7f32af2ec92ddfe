-- Puts a claimed event whose destination was down back to PENDING after its delay (? µs), without
-- counting a try; fenced by the claim token. Binds: delay, error, id, claim token.
UPDATE outbox_events
SET status       = 'PENDING',
    locked_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    last_error   = ?,
    updated_at   = UTC_TIMESTAMP(6)
WHERE id = ? AND claim_token = ? AND status = 'PROCESSING'
