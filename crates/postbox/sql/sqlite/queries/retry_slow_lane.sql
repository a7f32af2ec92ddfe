-- The slow lane: up to ?3 FAILED events whose last try is more than ?1 seconds old, and which
-- had fewer than ?2 slow-lane tries, get one more try. retry_count is raised to max_retries, so
-- that one failure sends the event back to FAILED (retry_count - max_retries is then the number
-- of slow-lane tries it had). ?4: a JSON array of GLOB patterns of event types the slow lane
-- skips (retry policies).
UPDATE outbox_events
SET status = 'PENDING', retry_count = MAX(retry_count, max_retries), locked_until = NULL,
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (
    SELECT id FROM outbox_events
    WHERE status = 'FAILED'
      AND julianday(updated_at) < julianday('now') - ?1 / 86400.0
      AND retry_count < max_retries + ?2
      AND skipped_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM json_each(?4) AS x WHERE outbox_events.event_type GLOB x.value)
    ORDER BY id
    LIMIT ?3
)
