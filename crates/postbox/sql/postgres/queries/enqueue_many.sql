-- Many events in one multi-row INSERT, in the caller's transaction, without a notification.
-- Rows: (id, idempotency_key) of each new event.
INSERT INTO {schema}.outbox_events
    (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
     idempotency_key, max_retries)
SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::int[],
                     $7::jsonb[], $8::text[], $9::int[])
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key
