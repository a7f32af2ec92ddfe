-- One event, in the caller's transaction. pg_notify is delivered only if that transaction commits.
-- $1..$9 columns, $10 the schema name (the notification's payload), or NULL for no notification
WITH ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9)
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT ins.id FROM ins
LEFT JOIN LATERAL (SELECT pg_notify('postbox_events', $10) WHERE $10::text IS NOT NULL) AS wake ON true
