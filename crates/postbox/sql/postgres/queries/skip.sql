-- An operator's skip of the held-back head of an aggregate (`postbox events skip`): the event goes
-- FAILED (if it was waiting for a retry) and no longer holds back the later events of its
-- aggregate. Events in flight (PROCESSING) are left alone. $1 ids. Returns the ids skipped.
UPDATE {schema}.outbox_events
SET status = 'FAILED', skipped_at = now(), locked_until = NULL,
    last_error = coalesce(last_error, 'skipped by an operator'), updated_at = now()
WHERE id = ANY($1::bigint[])
  AND skipped_at IS NULL
  AND status IN ('PENDING', 'FAILED')
RETURNING id
