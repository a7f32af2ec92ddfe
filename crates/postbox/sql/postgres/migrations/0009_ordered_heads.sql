-- The claim of this release: 0008's, which no longer walks every event waiting behind an ordered
-- aggregate.
--
-- While one claim's events of an ordered aggregate are in flight, or while its head is FAILED
-- (parked) or backing off, every later event of that aggregate waits. 0008's claim walked them
-- all from the floor, each with a probe of its aggregate, to find nothing: with 100 aggregates
-- in flight and 50,000 events behind them, a claim read 50,000 rows. This claim reads the due
-- events of $9 ids from the first one at or above the floor (0: no limit; a relay passes four
-- times its batch size).
-- When that walk came short of a full batch and events in it wait for their aggregates, it
-- finds the ready aggregates' heads directly instead; when nothing in it waits (other relays
-- took its rows, or they were done), it walks on as 0008's claim did:
-- - aggregates: the aggregates that have unfinished events, one index descent each, by a loose
--   scan of outbox_events_aggregate_idx from its end (an aggregate's newest entries are the
--   ones least likely to be dead versions left by marks); at most 4 × $1 of them, all of them
--   when $10 (a sweep) is true;
-- - heads: each one's first unfinished event, one descent each; an aggregate whose head is in
--   flight, backing off, FAILED or above the commit horizon is not ready;
-- - taken: from each ready head, its aggregate's next due events past the walk, a share of what
--   the batch still lacks each.
-- Its cost is a descent or two per aggregate looked at and the rows it takes, however many events
-- wait. A sweep (a relay makes one a second) also takes the due events past the walk that are
-- not ordered (no aggregate, or a type not in $5), by one read of them without a probe each;
-- so neither an aggregate past the first 4 × $1 nor an event that is not ordered waits behind
-- the others for longer than that.
--
-- The eight-argument postbox_claim of 0008 stays: relays of this release without ordered
-- aggregate types call it (claim_unordered.sql), since this one plans its ordered paths on
-- every call; so do relays of the previous release during a rolling upgrade.

CREATE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[], bigint,
                                       text, bigint, integer, boolean)
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
WITH start AS MATERIALIZED (
    -- With ordered aggregate types and a limit, where the walk starts: the first due event at
    -- or above the floor (past the events in flight there).
    SELECT CASE WHEN cardinality($5) > 0 AND $9 > 0 THEN (
               SELECT e.id FROM {schema}.outbox_events e
               WHERE e.status IN ('PENDING', 'PROCESSING')
                 AND e.id >= $8
                 AND (e.locked_until IS NULL OR e.locked_until < now())
               ORDER BY e.id
               LIMIT 1)
           END AS id
), bound AS MATERIALIZED (
    -- The last id the walk reads: $9 ids from its start (none: it reads to the end). Ids, not
    -- rows: it costs no read, and a range thinned by events done meanwhile only sends the claim
    -- on (see onward below).
    SELECT s.id + $9 - 1 AS id FROM start s
), fresh AS MATERIALIZED (
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id >= coalesce((SELECT s.id FROM start s), $8)
      AND e.id <= coalesce((SELECT b.id FROM bound b), 9223372036854775807)
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
), short AS MATERIALIZED (
    -- What the batch still lacks after a walk that stopped at its limit, and whether events in
    -- the walk wait for their aggregates.
    SELECT s.n,
           CASE WHEN s.n > 0 THEN EXISTS (
               SELECT 1 FROM {schema}.outbox_events e
               WHERE e.status IN ('PENDING', 'PROCESSING')
                 AND e.id >= (SELECT s.id FROM start s)
                 AND e.id <= (SELECT b.id FROM bound b)
                 AND (e.locked_until IS NULL OR e.locked_until < now())
                 AND {schema}.postbox_waits_in_order(e.aggregate_type, e.aggregate_id, e.id,
                                                     $5, $6))
           ELSE false END AS blocked
    FROM (SELECT CASE WHEN (SELECT b.id FROM bound b) IS NULL THEN 0
                      ELSE greatest(0, $1 - (SELECT count(*) FROM fresh)
                                          - (SELECT count(*) FROM retried))
                 END AS n) s
), lacking AS MATERIALIZED (
    -- What the heads below are to find: the rest of the batch, when events of the walk wait.
    SELECT CASE WHEN s.blocked THEN s.n ELSE 0 END AS n FROM short s
), onward AS MATERIALIZED (
    -- A walk short of a batch with nothing in it waiting (its rows were taken by other relays,
    -- or done): on past its limit in id order, as 0008's claim walks.
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id > (SELECT b.id FROM bound b)
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT {schema}.postbox_waits_in_order(e.aggregate_type, e.aggregate_id, e.id, $5, $6)
      AND (SELECT CASE WHEN s.blocked THEN 0 ELSE s.n END FROM short s) > 0
    ORDER BY e.id
    LIMIT (SELECT CASE WHEN s.blocked THEN 0 ELSE s.n END FROM short s)
    FOR UPDATE OF e SKIP LOCKED
), loose AS MATERIALIZED (
    -- A sweep's due events past the walk that are not ordered: no probe of their aggregates.
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE $10
      AND e.status IN ('PENDING', 'PROCESSING')
      AND e.id > (SELECT b.id FROM bound b)
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5)
      AND (SELECT l.n FROM lacking l) > 0
    ORDER BY e.id
    LIMIT (SELECT l.n FROM lacking l)
    FOR UPDATE OF e SKIP LOCKED
), heads AS MATERIALIZED (
    WITH RECURSIVE aggregates(aggregate_type, aggregate_id, n) AS (
        (SELECT e.aggregate_type, e.aggregate_id, 1
         FROM {schema}.outbox_events e
         WHERE e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
           AND e.aggregate_id IS NOT NULL AND e.aggregate_type IS NOT NULL
           AND (SELECT l.n FROM lacking l) > 0
         ORDER BY e.aggregate_type DESC, e.aggregate_id DESC, e.id DESC
         LIMIT 1)
        UNION ALL
        SELECT n.aggregate_type, n.aggregate_id, p.n + 1
        FROM aggregates p
        CROSS JOIN LATERAL (
            SELECT e.aggregate_type, e.aggregate_id
            FROM {schema}.outbox_events e
            WHERE e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
              AND e.aggregate_id IS NOT NULL
              AND (e.aggregate_type, e.aggregate_id) < (p.aggregate_type, p.aggregate_id)
            ORDER BY e.aggregate_type DESC, e.aggregate_id DESC, e.id DESC
            LIMIT 1) n
        WHERE $10 OR p.n < 4 * $1
    )
    SELECT h.id, a.aggregate_type, a.aggregate_id
    FROM aggregates a
    CROSS JOIN LATERAL (
        SELECT e.id, e.status, e.locked_until
        FROM {schema}.outbox_events e
        WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id
          AND e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT 1) h
    WHERE {schema}.postbox_is_ordered(a.aggregate_type, a.aggregate_id, $5)
      AND h.status IN ('PENDING', 'PROCESSING')
      AND (h.locked_until IS NULL OR h.locked_until < now())
      AND h.id <= $6
), taken AS MATERIALIZED (
    SELECT t.id, t.stale, t.retry_count, t.max_retries, t.aggregate_type, t.aggregate_id
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
               e.aggregate_type, e.aggregate_id
        FROM {schema}.outbox_events e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.status IN ('PENDING', 'PROCESSING') AND e.skipped_at IS NULL
          AND e.id >= h.id
          AND e.id > (SELECT b.id FROM bound b)
          AND e.id <= $6
          AND (e.locked_until IS NULL OR e.locked_until < now())
        -- The aggregate index's order (the same as id order here): read through it, never
        -- through the polling index in id order, which would walk the other aggregates.
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT ceil((SELECT l.n FROM lacking l)::numeric / (SELECT count(*) FROM heads))
        FOR UPDATE OF e SKIP LOCKED) t
), walked AS MATERIALIZED (
    -- The paths' rows in id order, a batch of them (rows locked beyond it are let go at the end
    -- of the claim's transaction).
    SELECT w.id, w.stale, w.stale AND w.retry_count + 1 >= w.max_retries AS exhausting,
           {schema}.postbox_is_ordered(w.aggregate_type, w.aggregate_id, $5) AS ordered,
           w.aggregate_type, w.aggregate_id
    FROM (SELECT * FROM retried UNION ALL SELECT * FROM fresh UNION ALL SELECT * FROM taken
          UNION ALL SELECT * FROM loose UNION ALL SELECT * FROM onward) w
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

-- Autovacuum may analyze the outbox table again (0003_no_auto_analyze.sql turned it off). The
-- snapshot an ANALYZE holds while it samples keeps the dead row versions of the marks made
-- meanwhile, like any other snapshot; since 0008 claims take new work from a floor and no longer
-- walk those, statistics cost a drain nothing, and the operators' own queries of the table get
-- fresh ones. ALTER TABLE … RESET takes a lock that producers' inserts and relays' marks do not
-- wait for.
ALTER TABLE {schema}.outbox_events RESET (autovacuum_analyze_threshold);
