-- The slow lane's picked events ({ids}) back to PENDING for one more try: retry_count raised to
-- max_retries, so one failure makes them FAILED again.
UPDATE outbox_events
SET retry_count = GREATEST(retry_count, max_retries), status = 'PENDING', locked_until = NULL,
    updated_at = UTC_TIMESTAMP(6),
    -- Below a relay's floor a retried event is found by its last_error (claim_retried.sql);
    -- ? store::RETRIED_BY_SLOW_LANE, bound first.
    last_error = COALESCE(last_error, ?)
WHERE status = 'FAILED' AND id IN ({ids})
