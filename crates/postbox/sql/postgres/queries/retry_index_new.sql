-- The retry index (migration 0008_claim.sql) of a table created in the same transaction (a tenant
-- being added): nothing else can see the table yet, so it is built at once, inside the
-- transaction, rather than concurrently after it (queries/retry_index.sql).
CREATE INDEX IF NOT EXISTS outbox_events_retry_idx
    ON {schema}.outbox_events ((coalesce(locked_until, '-infinity'::timestamptz)), id)
    WHERE last_error IS NOT NULL AND status <> 'PROCESSED' AND status <> 'FAILED'
