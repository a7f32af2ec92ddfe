-- The picked events ({ids}) go FAILED and no longer hold back the later events of their
-- aggregate; a retry undoes it.
UPDATE outbox_events
SET status = 'FAILED', skipped_at = UTC_TIMESTAMP(6), locked_until = NULL,
    last_error = COALESCE(last_error, 'skipped by an operator'), updated_at = UTC_TIMESTAMP(6)
WHERE id IN ({ids})
