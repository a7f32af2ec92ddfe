-- One short claim (DESIGN §3): due rows in id order, rows other relays hold are skipped; a row
-- still PROCESSING is a stale claim, whose take-over counts as a failed try (FAILED on its last).
-- The statement lives in the function postbox_claim (migration 0002_claim_function.sql), which
-- pins its plan to the polling index whatever the table's statistics say.
-- $1 batch size, $2 lease in ms, $3 relay id, $4 claim token
SELECT id, stale, exhausted, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
       headers, event_class, schema_version, retry_count, max_retries, created_at, last_error
FROM {schema}.postbox_claim($1::integer, $2::float8, $3::text, $4::uuid)
