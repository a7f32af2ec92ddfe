-- The claim of events whose ids the relay learnt of elsewhere, committed (the CDC relay reads
-- them from the WAL, in commit order): those of `$1` still PENDING and never tried, leased as
-- claim.sql leases them. An event of an ordered aggregate type is taken only when no earlier
-- event of its aggregate is unfinished (or when those are taken by this claim, which then
-- holds them in id order), and no other event of its aggregate, whatever its id, is in flight
-- (PROCESSING, under a running lease or a stale one the polling claim takes over) or FAILED
-- and not skipped: the slot delivers in commit order, which is not id order when producers
-- commit out of it, so an event with a lower id can arrive while a later one of its aggregate
-- is being published. What waits, and every retry, stays to the polling claim.
-- $1 ids, $2 lease in ms, $3 relay id, $4 claim token, $5 the ordered aggregate types ('*' for
-- all, empty for none). Columns as claim.sql returns them.
WITH cand AS MATERIALIZED (
    SELECT e.id, e.aggregate_type, e.aggregate_id,
           {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5::text[]) AS ordered
    FROM {schema}.outbox_events e
    WHERE e.id = ANY($1::bigint[])
      AND e.status = 'PENDING'
      AND e.last_error IS NULL
      AND (e.locked_until IS NULL OR e.locked_until < now())
    ORDER BY e.id
    FOR UPDATE OF e SKIP LOCKED
), counted AS (
    SELECT c.*, count(*) OVER (
               PARTITION BY c.aggregate_type, c.aggregate_id ORDER BY c.id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS taken_before
    FROM cand c
), busy AS (
    -- Ordered aggregates with an event in flight or FAILED past the first of them here (one
    -- walk of the aggregate's unfinished entries per claim, not one per event): an event
    -- before it is counted below.
    SELECT a.aggregate_type, a.aggregate_id
    FROM (SELECT c.aggregate_type, c.aggregate_id, min(c.id) AS first
          FROM cand c WHERE c.ordered
          GROUP BY c.aggregate_type, c.aggregate_id) a
    WHERE EXISTS (
        SELECT 1 FROM {schema}.outbox_events b
        WHERE b.aggregate_type = a.aggregate_type
          AND b.aggregate_id = a.aggregate_id
          AND b.id > a.first
          AND b.status IN ('PROCESSING', 'FAILED')
          AND b.skipped_at IS NULL
          AND b.aggregate_id IS NOT NULL)
), picked AS (
    SELECT c.id
    FROM counted c
    WHERE NOT c.ordered
       OR (c.taken_before = (
               SELECT count(*) FROM {schema}.outbox_events b
               WHERE b.aggregate_type = c.aggregate_type
                 AND b.aggregate_id = c.aggregate_id
                 AND b.id < c.id
                 AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                 AND b.skipped_at IS NULL)
           AND NOT EXISTS (SELECT 1 FROM busy u
                           WHERE u.aggregate_type = c.aggregate_type
                             AND u.aggregate_id = c.aggregate_id))
)
UPDATE {schema}.outbox_events AS e
SET status       = 'PROCESSING',
    locked_until = now() + $2::float8 * interval '1 millisecond',
    locked_by    = $3::text,
    claim_token  = $4::uuid,
    updated_at   = now()
FROM picked p
WHERE e.id = p.id
RETURNING e.id, false AS stale, false AS exhausted, e.event_type::text, e.aggregate_type::text,
          e.aggregate_id::text, e.idempotency_key::text, e.payload::text, e.headers::text AS headers,
          e.event_class::text, e.schema_version, e.retry_count, e.max_retries, e.created_at,
          e.last_error
