-- Many events in one multi-row INSERT, in the caller's transaction.
WITH ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::int[],
                         $7::jsonb[], $8::text[], $9::int[])
    ON CONFLICT DO NOTHING
    RETURNING id, idempotency_key
)
SELECT ins.id, ins.idempotency_key FROM ins
LEFT JOIN LATERAL (SELECT pg_notify('postbox_events', $10) WHERE $10::text IS NOT NULL) AS wake ON true
