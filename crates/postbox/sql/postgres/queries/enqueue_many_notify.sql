-- Many events in one multi-row INSERT, and a notification; $10 and the rows as in
-- enqueue_notify.sql (a NULL row for the notification).
WITH ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::int[],
                         $7::jsonb[], $8::text[], $9::int[])
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, idempotency_key
)
SELECT id, idempotency_key FROM ins
UNION ALL
SELECT NULL, NULL FROM (SELECT pg_notify('postbox_events', $10)) AS wake
