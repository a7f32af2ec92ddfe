-- The slow lane: up to $3 FAILED events whose last try is more than $1 seconds old, and which
-- had fewer than $2 slow-lane tries, get one more try. retry_count is raised to max_retries, so
-- that one failure sends the event back to FAILED (retry_count - max_retries is then the number
-- of slow-lane tries it had). $4: LIKE patterns of event types the slow lane skips (retry
-- policies); $5 what an empty last_error gets (store::RETRIED_BY_SLOW_LANE). Reads the FAILED
-- index, not the history.
WITH due AS (
    SELECT id FROM {schema}.outbox_events
    WHERE status = 'FAILED'
      AND updated_at < now() - $1::float8 * interval '1 second'
      AND retry_count < max_retries + $2
      AND NOT (event_type LIKE ANY ($4::text[]))
      AND skipped_at IS NULL
    ORDER BY id
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_events e
SET status = 'PENDING', retry_count = GREATEST(e.retry_count, e.max_retries),
    locked_until = NULL, updated_at = now(),
    -- Below a relay's floor a retried event is found by its last_error (functions/postbox_claim.sql).
    last_error = coalesce(e.last_error, $5)
FROM due d
WHERE e.id = d.id AND e.status = 'FAILED'
