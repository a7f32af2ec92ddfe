-- One event, in the caller's transaction. pg_notify is delivered only if that transaction commits.
-- $1..$9 columns, $10 the schema name (the notification's payload), or NULL for no notification.
-- The notification does not depend on the insert: an outbox that decided to notify does so even
-- when the event turns out a duplicate, or the events after it would wait for the next poll.
-- Rows: the new event's id (none for a duplicate), and a NULL row when a notification was sent.
WITH ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9)
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT NULL FROM (SELECT pg_notify('postbox_events', $10) WHERE $10::text IS NOT NULL) AS wake
