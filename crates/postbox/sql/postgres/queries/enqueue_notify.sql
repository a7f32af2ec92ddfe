-- One event, in the caller's transaction, and a notification, delivered only if that transaction
-- commits. $1..$9 columns, $10 the schema name (the notification's payload).
-- The notification does not depend on the insert: an outbox whose turn it is to notify does so
-- even when the event turns out a duplicate, or the events after it would wait for the poll.
-- Rows: the new event's id (none for a duplicate), and a NULL row for the notification.
-- A statement of its own, so that the plain insert (enqueue.sql), used between notifications,
-- carries nothing for them.
WITH ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9)
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id FROM ins
UNION ALL
SELECT NULL FROM (SELECT pg_notify('postbox_events', $10)) AS wake
