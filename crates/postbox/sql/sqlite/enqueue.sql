INSERT INTO outbox_events
    (event_type, aggregate_type, aggregate_id, payload, event_class, schema_version, headers,
     idempotency_key, max_retries)
VALUES (?1, ?2, ?3, json(?4), ?5, ?6, ?7, ?8, ?9)
ON CONFLICT DO NOTHING
RETURNING id
