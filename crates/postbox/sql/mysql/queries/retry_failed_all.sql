-- An operator's retry of every FAILED event (see retry_failed.sql).
UPDATE outbox_events
SET status = 'PENDING', retry_count = 0, locked_until = NULL, skipped_at = NULL,
    updated_at = UTC_TIMESTAMP(6),
    -- Below a relay's floor a retried event is found by its last_error (claim_retried.sql);
    -- ? store::RETRIED_BY_OPERATOR, bound first.
    last_error = COALESCE(last_error, ?)
WHERE status = 'FAILED'
