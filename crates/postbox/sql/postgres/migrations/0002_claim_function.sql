-- The claim as a function, so that its plan does not depend on the table's statistics. With
-- stale statistics (a new or truncated table, autovacuum off or behind) PostgreSQL would plan the
-- pick as a bitmap scan of the polling index plus a sort: bitmap scans visit every entry, the
-- dead ones of processed events included, and never mark them dead, so each claim would cost
-- more than the last. The polling index always serves this query, in id order, so sequential
-- and bitmap scans are turned off for it alone.
-- $1 batch size, $2 lease in ms, $3 relay id, $4 claim token (see claim.sql for the logic).
CREATE OR REPLACE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid)
RETURNS TABLE (
    id bigint, stale boolean, exhausted boolean, event_type text, aggregate_type text,
    aggregate_id text, idempotency_key text, payload text, headers jsonb, event_class text,
    schema_version integer, retry_count integer, max_retries integer, created_at timestamptz,
    last_error text
)
LANGUAGE sql
VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $claim$
WITH picked AS (
    SELECT id, status = 'PROCESSING' AS stale
    FROM {schema}.outbox_events
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_events AS e
SET status       = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = e.retry_count + CASE WHEN p.stale THEN 1 ELSE 0 END,
    last_error   = CASE WHEN p.stale
                        THEN 'lease expired: relay ' || coalesce(e.locked_by, '?')
                             || ' did not finish publishing in time (crashed or stalled)'
                        ELSE e.last_error END,
    locked_until = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries THEN NULL
                        ELSE now() + $2::float8 * interval '1 millisecond' END,
    locked_by    = $3,
    claim_token  = $4,
    updated_at   = now()
FROM picked p
WHERE e.id = p.id
RETURNING e.id, p.stale, e.status = 'FAILED', e.event_type::text, e.aggregate_type::text,
          e.aggregate_id::text, e.idempotency_key::text, e.payload::text, e.headers,
          e.event_class::text, e.schema_version, e.retry_count, e.max_retries, e.created_at,
          e.last_error
$claim$;
