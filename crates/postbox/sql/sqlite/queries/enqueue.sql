-- One event. No row back for a duplicate idempotency key; any other conflict is an error.
INSERT INTO outbox_events
    (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
     idempotency_key, max_retries)
VALUES (?1, ?2, ?3, json(?4), ?5, ?6, ?7, ?8, ?9)
ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
