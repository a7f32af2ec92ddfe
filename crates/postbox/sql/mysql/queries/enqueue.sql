-- One event, as the Rust Outbox writes it on MySQL (a duplicate idempotency key is reported by
-- the server and undone alone). Binds: event type, aggregate type, aggregate id, payload, event
-- class, schema version, headers, idempotency key, max retries.
INSERT INTO outbox_events
    (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
     idempotency_key, max_retries)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
