-- The slow lane's candidates: FAILED events whose last try is older than ? µs and that had fewer
-- than ? slow-lane tries, not skipped, in id order, locked (at most ? of them: a few more than
-- the batch, for the event types the slow lane excludes, matched in Rust).
SELECT id, event_type FROM outbox_events
WHERE status = 'FAILED'
  AND updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
  AND retry_count < max_retries + ?
  AND skipped_at IS NULL
ORDER BY id
LIMIT ?
FOR UPDATE SKIP LOCKED
