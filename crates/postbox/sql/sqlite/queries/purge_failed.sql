-- Up to ?2 FAILED events whose last try is more than ?1 seconds old are deleted (an operator's
-- purge; relays never delete FAILED events).
DELETE FROM outbox_events
WHERE id IN (
    SELECT id FROM outbox_events
    WHERE status = 'FAILED' AND julianday(updated_at) < julianday('now') - ?1 / 86400.0
    ORDER BY id
    LIMIT ?2
)
