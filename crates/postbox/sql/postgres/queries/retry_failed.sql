-- Puts FAILED events back in the queue with a fresh retry budget (an operator's retry).
-- $1 ids, or NULL for every FAILED event; $2 what an empty last_error gets
-- (store::RETRIED_BY_OPERATOR).
UPDATE {schema}.outbox_events
SET status = 'PENDING', retry_count = 0, locked_until = NULL, skipped_at = NULL, updated_at = now(),
    -- Below a relay's floor a retried event is found by its last_error (functions/postbox_claim.sql).
    last_error = coalesce(last_error, $2)
WHERE status = 'FAILED' AND ($1::bigint[] IS NULL OR id = ANY($1))
