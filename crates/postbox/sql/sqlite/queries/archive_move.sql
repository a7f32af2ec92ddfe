-- One batch of retention, second step: the PROCESSED events among ?1 (a JSON array of ids) are
-- copied to the archive; archive_delete.sql then removes them, in the same transaction.
INSERT INTO outbox_events_archive (
    id, status, event_type, aggregate_type, aggregate_id, payload, event_class, schema_version,
    headers, idempotency_key, retry_count, max_retries, last_error, processed_at, locked_until,
    locked_by, claim_token, created_at, updated_at, archived_at)
SELECT id, status, event_type, aggregate_type, aggregate_id, payload, event_class, schema_version,
       headers, idempotency_key, retry_count, max_retries, last_error, processed_at, locked_until,
       locked_by, claim_token, created_at, updated_at, strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
FROM outbox_events
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'PROCESSED'
