-- $1 ids, $2 claim token. Fenced: a row claimed since by another relay has another token.
UPDATE {schema}.outbox_events
SET status = 'PROCESSED', processed_at = now(), locked_until = NULL, updated_at = now()
WHERE id = ANY($1) AND claim_token = $2 AND status = 'PROCESSING'
