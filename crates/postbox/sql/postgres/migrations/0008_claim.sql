-- The claim of this release: one function for every relay, ordered aggregate types or not, whose
-- cost depends on the batch, not on what the marks left behind.
--
-- Every mark leaves a dead row version whose entry stays in the polling index until a vacuum
-- removes it, and while any snapshot older than the mark is open (a pg_dump, a long report, a
-- replica with hot_standby_feedback) nothing can remove it: a claim that walks the polling index
-- from its start walks all of them, and a drain becomes quadratic. So a relay claims new work
-- from a floor ($8, kept per table by the relay: postbox_floor below), an id below which every
-- event is finished or is one of the few exceptions, and finds the exceptions through an index
-- of their own:
-- - fresh: due events at or above the floor, in id order, through the polling index;
-- - retried: due events below the floor that went wrong once — a failed try backing off, an
--   event put back while its destination was down, a lease taken over, an operator's retry, the
--   slow lane — all of which have last_error set, through outbox_events_retry_idx (in due
--   order). Events without last_error below the floor cannot be unfinished: the floor never
--   passes one that is in flight or waiting, nor the commit horizon ($6), so a transaction that
--   commits late lands above it.
-- A relay without a floor passes 0: the claim then walks from the start (a relay of Postbox
-- always has one: postbox_floor answers at least 1).
--
-- With ordered aggregate types ($5; '*' for all, empty for none) the claim keeps 0007's rules:
-- an ordered event waits while an earlier event of its aggregate is unfinished and not claimable
-- now, or while its id is above the commit horizon ($6); of the rows locked, an ordered event is
-- kept only if every earlier unfinished event of its aggregate is kept too.
--
-- $7 is the text a stale event's last_error gets, `{relay}` standing for the relay that held it:
-- the wording is the library's (store::LEASE_EXPIRED), one text for every store.
-- The planner settings are 0004's: a claim of 100 reads about 100 rows whatever the table holds
-- and whatever its statistics say.
--
-- The four- and six-argument postbox_claim of 0004 and 0007 stay for relays of the previous
-- release while a rolling upgrade replaces them; nothing of this release calls them. They walk
-- from the start of the polling index, and relays of both releases claim side by side safely.

-- The retry index (outbox_events_retry_idx, on coalesce(locked_until, '-infinity') and id, of
-- rows with last_error set that are neither PROCESSED nor FAILED) is built by `postbox migrate`
-- right after this migration, with CREATE INDEX CONCURRENTLY: a plain CREATE INDEX would stop the
-- producers' inserts for as long as it reads a long table. The claim is correct without it,
-- only slower for retried events while it is missing.

-- Whether an event must wait for its aggregate (G6): it is of an ordered aggregate type and its id
-- is above the commit horizon, or an earlier event of its aggregate is unfinished and cannot be
-- claimed now (FAILED and not skipped, in flight, backing off).
CREATE FUNCTION {schema}.postbox_waits_in_order(agg_type text, agg_id text, event_id bigint,
                                                ordered text[], settled bigint)
RETURNS boolean
LANGUAGE sql
STABLE
AS $waits$
SELECT {schema}.postbox_is_ordered(agg_type, agg_id, ordered)
       AND (event_id > settled
            OR EXISTS (
                SELECT 1 FROM {schema}.outbox_events b
                WHERE b.aggregate_type = agg_type
                  AND b.aggregate_id = agg_id
                  AND b.id < event_id
                  AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                  AND b.skipped_at IS NULL
                  AND NOT (b.status IN ('PENDING', 'PROCESSING')
                           AND (b.locked_until IS NULL OR b.locked_until < now()))))
$waits$;

-- The floor of a relay's next claims (see above): from its last floor `from_id`, the first event
-- that is in flight or waiting without having gone wrong (last_error NULL), but never above
-- `up_to`, the commit horizon + 1. Reads from the last floor to that event: what was done since
-- the last call, not the history. From 0 (a relay's first claim, and its sweep every minute) it
-- reads the polling index from its start, through a statement of its own: a range from 0 could
-- be read through the primary key instead, which holds the history, when statistics taken
-- while a backlog was pending make both look alike.
CREATE FUNCTION {schema}.postbox_floor(from_id bigint, up_to bigint)
RETURNS bigint
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $floor$
SELECT least(up_to,
             coalesce(CASE WHEN from_id > 0
                           THEN (SELECT e.id FROM {schema}.outbox_events e
                                 WHERE e.status IN ('PENDING', 'PROCESSING')
                                   AND e.id >= from_id
                                   AND e.last_error IS NULL
                                 ORDER BY e.id
                                 LIMIT 1)
                           ELSE (SELECT e.id FROM {schema}.outbox_events e
                                 WHERE e.status IN ('PENDING', 'PROCESSING')
                                   AND e.last_error IS NULL
                                 ORDER BY e.id
                                 LIMIT 1)
                      END,
                      up_to))
$floor$;

CREATE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[], bigint,
                                       text, bigint)
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
WITH fresh AS MATERIALIZED (
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id >= $8
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT {schema}.postbox_waits_in_order(e.aggregate_type, e.aggregate_id, e.id, $5, $6)
    ORDER BY e.id
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), retried AS MATERIALIZED (
    -- Written with <> rather than IN so that only the retry index's predicate matches it, never
    -- the polling index's (whose walk from the start is what this claim avoids).
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.last_error IS NOT NULL AND e.status <> 'PROCESSED' AND e.status <> 'FAILED'
      AND coalesce(e.locked_until, '-infinity'::timestamptz) < now()
      AND e.id < $8
      AND NOT {schema}.postbox_waits_in_order(e.aggregate_type, e.aggregate_id, e.id, $5, $6)
    ORDER BY coalesce(e.locked_until, '-infinity'::timestamptz)
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), walked AS MATERIALIZED (
    -- Both paths' rows in id order, a batch of them (rows locked beyond it are let go at the
    -- end of the claim's transaction).
    SELECT w.id, w.stale, w.stale AND w.retry_count + 1 >= w.max_retries AS exhausting,
           {schema}.postbox_is_ordered(w.aggregate_type, w.aggregate_id, $5) AS ordered,
           w.aggregate_type, w.aggregate_id
    FROM (SELECT * FROM retried UNION ALL SELECT * FROM fresh) w
    ORDER BY w.id
    LIMIT $1
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
