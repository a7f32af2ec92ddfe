-- The claim of a relay with ordered aggregate types (G6): see claim.sql, and postbox_claim in
-- migration 0007_ordering.sql. $5 the ordered aggregate types ('*' for all), $6 the commit
-- horizon (ordered events above it are not claimed yet).
SELECT id, stale, exhausted, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
       headers::text AS headers, event_class, schema_version, retry_count, max_retries,
       created_at, last_error
FROM {schema}.postbox_claim($1::integer, $2::float8, $3::text, $4::uuid, $5::text[], $6::bigint)
