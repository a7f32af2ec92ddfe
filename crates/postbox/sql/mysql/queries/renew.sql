-- Extends the lease (? µs from the database clock) of events still being published under the
-- claim token (?): {ids}. Rows another relay has taken over since are left alone (G4).
UPDATE outbox_events
SET locked_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND,
    updated_at   = UTC_TIMESTAMP(6)
WHERE claim_token = ? AND status = 'PROCESSING' AND id IN ({ids})
