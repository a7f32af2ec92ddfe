-- The slow lane's picked events ({ids}) back to PENDING for one more try: retry_count raised to
-- max_retries, so one failure makes them FAILED again.
UPDATE outbox_events
SET retry_count = GREATEST(retry_count, max_retries), status = 'PENDING', locked_until = NULL,
    updated_at = UTC_TIMESTAMP(6)
WHERE status = 'FAILED' AND id IN ({ids})
