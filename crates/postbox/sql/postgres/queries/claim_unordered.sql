-- The claim of a relay without ordered aggregate types: claim.sql's, through the eight-argument
-- postbox_claim (functions/postbox_claim.sql): the ten-argument one without the paths for ordered
-- aggregates, nor the per-row check of whether a row waits for its aggregate, which a relay that
-- orders nothing has no use for (a fifth of a claim of 500).
-- One short claim (docs/architecture.md, "The contract"): due rows in id order, rows other relays hold are skipped; a row
-- still PROCESSING is a stale claim, whose take-over counts as a failed try (FAILED on its last).
-- The statement lives in the function postbox_claim, which pins its plan whatever the table's
-- statistics say, and claims new work from the relay's floor ($8).
-- $1 batch size, $2 lease in ms, $3 relay id, $4 claim token, $5 the ordered aggregate types
-- ('*' for all, empty for none: G6), $6 the commit horizon (ordered events above it are not
-- claimed yet), $7 a stale event's last_error ({relay} for the relay that held it), $8 the
-- floor (0: from the start).
-- Columns by name, as every store's claim returns them (see store/row.rs); headers as the JSON
-- text PostgreSQL stores, read in Rust so that a row it cannot read fails alone.
SELECT id, stale, exhausted, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
       headers::text AS headers, event_class, schema_version, retry_count, max_retries,
       created_at, last_error
FROM {schema}.postbox_claim($1::integer, $2::float8, $3::text, $4::uuid, $5::text[], $6::bigint,
                            $7::text, $8::bigint)
