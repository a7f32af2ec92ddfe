-- The read, without a claim, of events whose ids the relay learnt of elsewhere, committed (the
-- CDC relay reads them from the WAL, in commit order): those of `$1` still PENDING, never tried
-- and of no ordered aggregate type. Nothing is written: the relay publishes them and then marks
-- them with mark_unclaimed.sql, one write per event instead of a claim's and a mark's. A relay
-- that polls beside it may claim one of them meanwhile and publish it too (at-least-once);
-- an event of an ordered aggregate type is claimed by claim_ids.sql instead.
-- $1 ids, $2 the ordered aggregate types ('*' for all, empty for none). Columns as claim.sql
-- returns them.
SELECT e.id, false AS stale, false AS exhausted, e.event_type::text, e.aggregate_type::text,
       e.aggregate_id::text, e.idempotency_key::text, e.payload::text, e.headers::text AS headers,
       e.event_class::text, e.schema_version, e.retry_count, e.max_retries, e.created_at,
       e.last_error
FROM {schema}.outbox_events e
WHERE e.id = ANY($1::bigint[])
  AND e.status = 'PENDING'
  AND e.last_error IS NULL
  AND (e.locked_until IS NULL OR e.locked_until < now())
  AND NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $2::text[])
ORDER BY e.id
