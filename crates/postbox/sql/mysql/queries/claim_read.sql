-- The last step of the claim: the taken rows ({ids}) read back in id order (MySQL's UPDATE has
-- no RETURNING), with which of them were stale ({stale}; NULL when none). Columns by name, as
-- every store's claim returns them (see store/row.rs).
SELECT id, status = 'FAILED' AS exhausted, event_type, aggregate_type, aggregate_id,
       idempotency_key, payload, headers, event_class, schema_version, retry_count, max_retries,
       created_at, last_error, id IN ({stale}) AS stale
FROM outbox_events
WHERE id IN ({ids})
ORDER BY id
