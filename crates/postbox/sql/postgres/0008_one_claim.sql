-- One claim for every relay, ordered aggregate types or not (the relays of this release call only
-- this one). It is migration 0007's ordered claim (see there for how ordering is kept), with:
-- $5 the ordered aggregate types ('*' for all; an empty array turns ordering off, and the claim
--    is then 0004's: due rows in id order, stale ones taken over as a failed try),
-- $6 the commit horizon (ordered events above it wait),
-- $7 the text a stale event's last_error gets, `{relay}` standing for the relay that held it: the
--    wording is the library's (store::LEASE_EXPIRED), one text for every store.
-- The planner settings are 0004's: a claim of 100 reads about 100 rows whatever the table holds
-- and whatever its statistics say.
--
-- The four- and six-argument postbox_claim of 0004 and 0007 stay for relays of the previous
-- release while a rolling upgrade replaces them; nothing of this release calls them.
CREATE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[], bigint,
                                       text)
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
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
AS $claim$
WITH walked AS MATERIALIZED (
    SELECT e.id, e.status = 'PROCESSING' AS stale,
           e.status = 'PROCESSING' AND e.retry_count + 1 >= e.max_retries AS exhausting,
           {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5) AS ordered,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND (NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5)
           OR (e.id <= $6
               AND NOT EXISTS (
                   SELECT 1 FROM {schema}.outbox_events b
                   WHERE b.aggregate_type = e.aggregate_type
                     AND b.aggregate_id = e.aggregate_id
                     AND b.id < e.id
                     AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                     AND b.skipped_at IS NULL
                     AND NOT (b.status IN ('PENDING', 'PROCESSING')
                              AND (b.locked_until IS NULL OR b.locked_until < now())))))
    ORDER BY e.id
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), counted AS (
    -- Per walked row, how many earlier rows of its aggregate this claim takes (and keeps
    -- PROCESSING): a sort of the batch, not a scan of it per row.
    SELECT w.*, count(*) FILTER (WHERE NOT w.exhausting) OVER (
               PARTITION BY w.aggregate_type, w.aggregate_id ORDER BY w.id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS taken_before
    FROM walked w
), picked AS (
    SELECT c.id, c.stale
    FROM counted c
    WHERE NOT c.ordered
       OR c.taken_before = (
           SELECT count(*) FROM {schema}.outbox_events b
           WHERE b.aggregate_type = c.aggregate_type
             AND b.aggregate_id = c.aggregate_id
             AND b.id < c.id
             AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
             AND b.skipped_at IS NULL)
)
UPDATE {schema}.outbox_events AS e
SET status       = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = e.retry_count + CASE WHEN p.stale THEN 1 ELSE 0 END,
    last_error   = CASE WHEN p.stale
                        THEN replace($7, '{relay}', coalesce(e.locked_by, '?'))
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
