-- The walked PROCESSED events ({ids}) copied into the archive (archive_delete.sql then removes
-- them from the table, in the same transaction).
INSERT INTO outbox_events_archive (id, status, event_type, aggregate_type, aggregate_id, payload,
                                   event_class, schema_version, headers, idempotency_key,
                                   retry_count, max_retries, last_error, processed_at,
                                   locked_until, locked_by, claim_token, skipped_at, created_at,
                                   updated_at)
SELECT id, status, event_type, aggregate_type, aggregate_id, payload, event_class, schema_version,
       headers, idempotency_key, retry_count, max_retries, last_error, processed_at, locked_until,
       locked_by, claim_token, skipped_at, created_at, updated_at
FROM outbox_events
WHERE status = 'PROCESSED' AND id IN ({ids})
