-- $1 ids read by read_ids.sql and published. Only rows still as read_ids.sql found them:
-- one claimed since by a polling relay is that relay's to mark, one that failed there is its
-- retry's. Returns the ids it marked.
UPDATE {schema}.outbox_events
SET status = 'PROCESSED', processed_at = now(), locked_until = NULL, updated_at = now()
WHERE id = ANY($1)
  AND status = 'PENDING'
  AND last_error IS NULL
  AND (locked_until IS NULL OR locked_until < now())
RETURNING id
