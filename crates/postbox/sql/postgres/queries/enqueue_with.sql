-- A business statement and one event, as one statement: one round trip to the server for both.
-- The caller's data-modifying statement goes in place of the `business` marker below, with its
-- own parameters $1..$n; the markers `e1` to `e9` stand for the event's columns and `e10` for
-- the notification's payload (the schema), numbered from $n+1 when the statement is put
-- together. Without a notification the statement ends at the `postbox:notify` line.
-- PostgreSQL runs a data-modifying WITH query exactly once whether or not it is referenced, and
-- the whole statement succeeds or fails as one: an error in either part writes neither.
-- Rows: the new event's id (none for a duplicate), and a NULL row for a notification.
WITH postbox_business AS (
{business}
), ins AS (
    INSERT INTO {schema}.outbox_events
        (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
         idempotency_key, max_retries)
    VALUES ({e1}, {e2}, {e3}, {e4}::jsonb, {e5}, {e6}, {e7}::jsonb, {e8}, {e9})
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
)
SELECT id FROM ins
-- postbox:notify
UNION ALL
SELECT NULL FROM (SELECT pg_notify('postbox_events', {e10})) AS wake
