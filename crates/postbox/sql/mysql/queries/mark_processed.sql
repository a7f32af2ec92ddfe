-- Marks acknowledged events ({ids}) PROCESSED, fenced by the claim token (?): rows another relay
-- has taken over since are left alone (G4).
UPDATE outbox_events
SET status       = 'PROCESSED',
    processed_at = UTC_TIMESTAMP(6),
    locked_until = NULL,
    updated_at   = UTC_TIMESTAMP(6)
WHERE claim_token = ? AND status = 'PROCESSING' AND id IN ({ids})
