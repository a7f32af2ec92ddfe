-- The unfinished events, below the claim's last picked id (?), of the ordered aggregates it
-- picked ({aggregates}: (type, id) pairs). Read committed: an event another claim has locked but
-- not yet taken still reads PENDING, and holds its aggregate back: only ordered events whose
-- every earlier unfinished event was picked too are the claim's.
SELECT id, aggregate_type, aggregate_id
FROM outbox_events
WHERE status IN ('PENDING', 'PROCESSING', 'FAILED') AND skipped_at IS NULL
  AND id < ?
  AND (aggregate_type, aggregate_id) IN ({aggregates})
