-- One event, in the caller's transaction, without a notification (see enqueue_notify.sql).
-- $1..$9 columns. Returns the new event's id, or no row for a duplicate. Only an idempotency
-- key that exists makes a duplicate; any other conflict (an id already taken) is an error.
INSERT INTO {schema}.outbox_events
    (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
     idempotency_key, max_retries)
VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7::jsonb, $8, $9)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
