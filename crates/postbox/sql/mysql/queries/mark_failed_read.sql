-- What became of one failed try (mark_failed.sql) of event ?: its tries so far, and whether it is
-- FAILED for good.
SELECT retry_count, status = 'FAILED' FROM outbox_events WHERE id = ?
