-- An operator's skip of the held-back head of an aggregate: the event goes FAILED (if it was
-- waiting for a retry) and no longer holds back the later events of its aggregate. Events in
-- flight (PROCESSING) are left alone. ?1 ids as a JSON array. Returns the ids skipped.
UPDATE outbox_events
SET status = 'FAILED', skipped_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), locked_until = NULL,
    last_error = coalesce(last_error, 'skipped by an operator'),
    updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (SELECT value FROM json_each(?1))
  AND skipped_at IS NULL
  AND status IN ('PENDING', 'FAILED')
RETURNING id
