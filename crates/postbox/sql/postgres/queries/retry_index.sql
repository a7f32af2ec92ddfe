-- The retry index (migration 0008_claim.sql): the events below a relay's floor that a claim
-- still takes (last_error set, neither PROCESSED nor FAILED), by when they come due. Built
-- without blocking the producers' inserts; run outside a transaction.
CREATE INDEX CONCURRENTLY IF NOT EXISTS outbox_events_retry_idx
    ON {schema}.outbox_events ((coalesce(locked_until, '-infinity'::timestamptz)), id)
    WHERE last_error IS NOT NULL AND status <> 'PROCESSED' AND status <> 'FAILED'
