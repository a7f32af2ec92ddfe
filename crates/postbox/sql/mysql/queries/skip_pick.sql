-- An operator's skip: of the events asked for ({ids}), those that can be skipped (PENDING or
-- FAILED, not in flight, not skipped yet), locked, in id order.
SELECT id FROM outbox_events
WHERE skipped_at IS NULL AND status IN ('PENDING', 'FAILED') AND id IN ({ids})
ORDER BY id
FOR UPDATE
