-- A listed row (`postbox events list`), its columns named as store/row.rs reads them; the part
-- of the statement for each table adds `archived_at`.
SELECT id, status, event_type::text AS event_type, aggregate_type::text AS aggregate_type,
       aggregate_id::text AS aggregate_id, idempotency_key::text AS idempotency_key,
       event_class::text AS event_class, schema_version, headers::text AS headers,
       payload::text AS payload, retry_count, max_retries, last_error, processed_at,
       locked_until, locked_by, created_at, updated_at
