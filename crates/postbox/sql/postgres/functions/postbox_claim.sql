-- The claim: locks up to $1 due events for a relay ($3 its name, $4 the claim's token, $2 the
-- lease in seconds) and returns them, stale leases taken over and exhausted events marked.
--
-- Its cost depends on the batch, not on the history or on what marks left behind. Every mark
-- leaves a dead row version in the polling index until a vacuum removes it, and while a snapshot
-- older than the mark is open (a pg_dump, a long report, a replica with hot_standby_feedback)
-- nothing can: so a relay claims new work from a floor ($8, kept by the relay; postbox_floor),
-- an id below which every event is finished or is one of the few exceptions, found through an
-- index of their own:
-- - fresh: due events at or above the floor, in id order, through the polling index;
-- - retried: due events below the floor that went wrong once (a failed try backing off, an
--   event put back while its destination was down, a lease taken over, an operator's retry, the
--   slow lane), all of which have last_error set, through outbox_events_retry_idx (in due
--   order). The floor never passes an event in flight or waiting, nor the commit horizon ($6),
--   so a transaction that commits late lands above it.
-- $7 is the text a stale event's last_error gets, `{relay}` standing for the relay that held it
-- (the library's store::LEASE_EXPIRED, one text for every store).
--
-- Two signatures:
-- - eight arguments: relays without ordered aggregate types (queries/claim_unordered.sql);
-- - ten arguments: with ordered aggregate types ($5; '*' for all). An ordered event waits while
--   its id is above the commit horizon ($6) or an earlier event of its aggregate is unfinished
--   and not claimable now; of the rows locked, an ordered event is kept only if every earlier
--   unfinished event of its aggregate is kept too. It reads the due events of $9 ids from the
--   floor (0: no limit); when that walk comes short of a batch because events in it wait, it
--   finds the ready aggregates' heads directly (one index descent each, at most 4 × $1 of them,
--   all of them when $10, a sweep, is true) and takes each one's next due events. Its cost is a
--   descent or two per aggregate looked at and the rows it takes, however many events wait.
--
-- The planner settings keep a claim of 100 reading about 100 rows whatever the table holds and
-- whatever its statistics say.

CREATE OR REPLACE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[], bigint,
                                       text, bigint)
RETURNS TABLE (
    id bigint, stale boolean, exhausted boolean, event_type text, aggregate_type text,
    aggregate_id text, idempotency_key text, payload text, headers jsonb, event_class text,
    schema_version integer, retry_count integer, max_retries integer, created_at timestamptz,
    last_error text
)
LANGUAGE plpgsql
VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $claim$
-- Without ordered aggregate types ($5 empty: the relays of this release) no row waits for its
-- aggregate, so neither path asks postbox_waits_in_order (a function call per row read, a fifth
-- of a claim of 500) and every row locked is kept. PL/pgSQL, as the ten-argument claim, so that
-- each statement is planned once per session rather than at every call.
#variable_conflict use_column
DECLARE
    ids bigint[];
    stale_ids bigint[];
BEGIN
IF cardinality($5) = 0 THEN
    -- The rows are picked (and locked) first, then taken by id (postbox_claim_take).
    WITH fresh AS MATERIALIZED (
        SELECT e.id, e.status = 'PROCESSING' AS stale
        FROM {schema}.outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')
          AND e.id >= $8
          AND (e.locked_until IS NULL OR e.locked_until < now())
        ORDER BY e.id
        LIMIT $1
        FOR UPDATE OF e SKIP LOCKED
    ), retried AS MATERIALIZED (
        -- With <> rather than IN, so that only the retry index's predicate matches it, never
        -- the polling index's (whose walk from the start is what this claim avoids).
        SELECT e.id, e.status = 'PROCESSING' AS stale
        FROM {schema}.outbox_events e
        WHERE e.last_error IS NOT NULL AND e.status <> 'PROCESSED' AND e.status <> 'FAILED'
          AND coalesce(e.locked_until, '-infinity'::timestamptz) < now()
          AND e.id < $8
        ORDER BY coalesce(e.locked_until, '-infinity'::timestamptz)
        LIMIT $1
        FOR UPDATE OF e SKIP LOCKED
    )
    -- Both paths' rows in id order, a batch of them (rows locked beyond it are let go at the
    -- end of the claim's transaction).
    SELECT coalesce(array_agg(w.id), '{}'), coalesce(array_agg(w.id) FILTER (WHERE w.stale), '{}')
    INTO ids, stale_ids
    FROM (SELECT u.id, u.stale
          FROM (SELECT * FROM retried UNION ALL SELECT * FROM fresh) u
          ORDER BY u.id
          LIMIT $1) w;
    RETURN QUERY
    SELECT * FROM {schema}.postbox_claim_take(ids, stale_ids, $2, $3, $4, $7);
    RETURN;
END IF;
-- Ordered aggregate types: the claim of relays of earlier releases (0008), which ordered
-- through this signature; kept while they may run beside this one during an upgrade.
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
-- The picked rows, then taken by id (postbox_claim_take).
SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.stale), '{}')
INTO ids, stale_ids
FROM picked p;
RETURN QUERY
SELECT * FROM {schema}.postbox_claim_take(ids, stale_ids, $2, $3, $4, $7);
END
$claim$;

CREATE OR REPLACE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[],
                                                  bigint, text, bigint, integer, boolean)
RETURNS TABLE (
    id bigint, stale boolean, exhausted boolean, event_type text, aggregate_type text,
    aggregate_id text, idempotency_key text, payload text, headers jsonb, event_class text,
    schema_version integer, retry_count integer, max_retries integer, created_at timestamptz,
    last_error text
)
LANGUAGE plpgsql
VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $claim$
-- PL/pgSQL rather than SQL: PostgreSQL plans a SQL function's statement again at every call
-- (a third of an ordered claim's time), and keeps a PL/pgSQL one's plan for the session; the
-- settings above fix its shape, so the generic plan is the one a call would get.
#variable_conflict use_column
DECLARE
    ids bigint[];
    stale_ids bigint[];
BEGIN
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
           e.aggregate_type, e.aggregate_id, false AS headed
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id >= coalesce((SELECT s.id FROM start s), $8)
      AND e.id <= coalesce((SELECT b.id FROM bound b), 9223372036854775807)
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT EXISTS (SELECT FROM {schema}.postbox_waiting(e.aggregate_type, e.aggregate_id, e.id,
                                                        $5, $6))
    ORDER BY e.id
    -- The first events of the runs (see runs below), and no more: a claim locks only what it
    -- may take, so that claims made at the same moment take other aggregates.
    LIMIT least(8, ceil($1::numeric / 16))
    FOR UPDATE OF e SKIP LOCKED
), retried AS MATERIALIZED (
    -- Written with <> rather than IN so that only the retry index's predicate matches it, never
    -- the polling index's (whose walk from the start is what this claim avoids).
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id, false AS headed
    FROM {schema}.outbox_events e
    WHERE e.last_error IS NOT NULL AND e.status <> 'PROCESSED' AND e.status <> 'FAILED'
      AND coalesce(e.locked_until, '-infinity'::timestamptz) < now()
      AND e.id < $8
      AND NOT EXISTS (SELECT FROM {schema}.postbox_waiting(e.aggregate_type, e.aggregate_id, e.id,
                                                        $5, $6))
    ORDER BY coalesce(e.locked_until, '-infinity'::timestamptz)
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), runs AS MATERIALIZED (
    -- The ordered aggregates of the walk's first events, which this claim takes runs of, with
    -- what the walk took of each: up to ceil(B / K) events of each of K aggregates rather than a
    -- few of every one (with few aggregates, a claim in id order takes every aggregate's next
    -- events and leaves the other relays, and this relay's next claim, only aggregates in
    -- flight).
    SELECT f.aggregate_type, f.aggregate_id, max(f.id) AS last_id, count(*) AS n
    FROM fresh f
    WHERE {schema}.postbox_is_ordered(f.aggregate_type, f.aggregate_id, $5)
    GROUP BY f.aggregate_type, f.aggregate_id
), deep AS MATERIALIZED (
    -- Each run's next due events past what the walk took of it, through the aggregate index
    -- (a range of the aggregate, never the other aggregates' events in id order).
    SELECT t.id, t.stale, t.retry_count, t.max_retries, t.aggregate_type, t.aggregate_id, t.headed
    FROM runs r
    CROSS JOIN LATERAL (
        SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
               e.aggregate_type, e.aggregate_id, false AS headed
        FROM {schema}.outbox_events e
        WHERE e.aggregate_type = r.aggregate_type AND e.aggregate_id = r.aggregate_id
          AND e.status IN ('PENDING', 'PROCESSING') AND e.skipped_at IS NULL
          AND e.id > r.last_id
          AND e.id <= $6
          AND (e.locked_until IS NULL OR e.locked_until < now())
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT greatest(0, ceil($1::numeric / least(8, ceil($1::numeric / 16))) - r.n)
        FOR UPDATE OF e SKIP LOCKED) t
), wide AS MATERIALIZED (
    -- What the runs leave of the batch (aggregates with few events waiting: 10,000
    -- aggregates with a few each, say), from the rest of the walk in id order, as 0009's claim
    -- took it.
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id, true AS headed
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id > (SELECT max(f.id) FROM fresh f)
      AND e.id <= coalesce((SELECT b.id FROM bound b), 9223372036854775807)
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT EXISTS (SELECT 1 FROM runs r
                      WHERE r.aggregate_type = e.aggregate_type
                        AND r.aggregate_id = e.aggregate_id)
      -- Only an aggregate's first unfinished event, and not above the horizon: the rest of an
      -- aggregate waits for the next claim (with many aggregates a walk holds few of one), and
      -- what this finds needs no order check after (headed).
      AND NOT ({schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5)
               AND (e.id > $6
                    OR EXISTS (SELECT 1 FROM {schema}.outbox_events b
                               WHERE b.aggregate_type = e.aggregate_type
                                 AND b.aggregate_id = e.aggregate_id
                                 AND b.id < e.id
                                 AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                                 AND b.skipped_at IS NULL)))
      AND $1 > (SELECT count(*) FROM fresh) + (SELECT count(*) FROM deep)
    ORDER BY e.id
    LIMIT greatest(0, $1 - (SELECT count(*) FROM fresh) - (SELECT count(*) FROM deep))
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
                 AND EXISTS (SELECT FROM {schema}.postbox_waiting(e.aggregate_type, e.aggregate_id,
                                                            e.id, $5, $6)))
           ELSE false END AS blocked
    FROM (SELECT CASE WHEN (SELECT b.id FROM bound b) IS NULL THEN 0
                      ELSE greatest(0, $1 - (SELECT count(*) FROM fresh)
                                          - (SELECT count(*) FROM deep)
                                          - (SELECT count(*) FROM wide)
                                          - (SELECT count(*) FROM retried))
                 END AS n) s
), lacking AS MATERIALIZED (
    -- What the heads below are to find: the rest of the batch, when events of the walk wait.
    SELECT CASE WHEN s.blocked THEN s.n ELSE 0 END AS n FROM short s
), onward AS MATERIALIZED (
    -- A walk short of a batch with nothing in it waiting (its rows were taken by other relays,
    -- or done): on past its limit in id order, as 0008's claim walks.
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id, false AS headed
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND e.id > (SELECT b.id FROM bound b)
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT EXISTS (SELECT FROM {schema}.postbox_waiting(e.aggregate_type, e.aggregate_id, e.id,
                                                        $5, $6))
      AND (SELECT CASE WHEN s.blocked THEN 0 ELSE s.n END FROM short s) > 0
    ORDER BY e.id
    LIMIT (SELECT CASE WHEN s.blocked THEN 0 ELSE s.n END FROM short s)
    FOR UPDATE OF e SKIP LOCKED
), loose AS MATERIALIZED (
    -- A sweep's due events past the walk that are not ordered: no probe of their aggregates.
    SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
           e.aggregate_type, e.aggregate_id, false AS headed
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
), chosen AS MATERIALIZED (
    -- The ready heads that the rest of the batch takes runs of: the oldest ones that no other
    -- claim is taking at this moment (their rows are locked: skipped, so that claims made at
    -- the same moment take runs of other aggregates), as many as the batch lacks runs for.
    SELECT e.id, e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.id IN (SELECT h.id FROM heads h)
      AND e.status IN ('PENDING', 'PROCESSING')
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND NOT EXISTS (SELECT 1 FROM runs r
                      WHERE r.aggregate_type = e.aggregate_type
                        AND r.aggregate_id = e.aggregate_id)
    ORDER BY e.id
    LIMIT ceil((SELECT l.n FROM lacking l)::numeric
               / ceil($1::numeric / least(8, ceil($1::numeric / 16))))
    FOR UPDATE OF e SKIP LOCKED
), taken AS MATERIALIZED (
    SELECT t.id, t.stale, t.retry_count, t.max_retries, t.aggregate_type, t.aggregate_id, t.headed
    FROM chosen h
    CROSS JOIN LATERAL (
        SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
               e.aggregate_type, e.aggregate_id, false AS headed
        FROM {schema}.outbox_events e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.status IN ('PENDING', 'PROCESSING') AND e.skipped_at IS NULL
          AND e.id >= h.id
          AND e.id <= $6
          AND (e.locked_until IS NULL OR e.locked_until < now())
        -- The aggregate index's order (the same as id order here): read through it, never
        -- through the polling index in id order, which would walk the other aggregates.
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT ceil($1::numeric / least(8, ceil($1::numeric / 16)))
        FOR UPDATE OF e SKIP LOCKED) t
), spread AS MATERIALIZED (
    -- What the runs of the chosen heads leave of the batch (ready aggregates with a few events
    -- each), a share from each of the other ready heads past the walk, as 0009's claim took it.
    SELECT t.id, t.stale, t.retry_count, t.max_retries, t.aggregate_type, t.aggregate_id, t.headed
    FROM heads h
    CROSS JOIN LATERAL (
        SELECT e.id, e.status = 'PROCESSING' AS stale, e.retry_count, e.max_retries,
               e.aggregate_type, e.aggregate_id, false AS headed
        FROM {schema}.outbox_events e
        WHERE e.aggregate_type = h.aggregate_type AND e.aggregate_id = h.aggregate_id
          AND e.status IN ('PENDING', 'PROCESSING') AND e.skipped_at IS NULL
          AND e.id >= h.id
          AND e.id > (SELECT b.id FROM bound b)
          AND e.id <= $6
          AND (e.locked_until IS NULL OR e.locked_until < now())
        ORDER BY e.aggregate_type, e.aggregate_id, e.id
        LIMIT ceil(greatest(0, (SELECT l.n FROM lacking l) - (SELECT count(*) FROM taken))::numeric
                   / (SELECT count(*) FROM heads))
        FOR UPDATE OF e SKIP LOCKED) t
    WHERE (SELECT l.n FROM lacking l) > (SELECT count(*) FROM taken)
      AND NOT EXISTS (SELECT 1 FROM chosen c
                      WHERE c.aggregate_type = h.aggregate_type
                        AND c.aggregate_id = h.aggregate_id)
), walked AS MATERIALIZED (
    -- The paths' rows in id order, a batch of them, so that what the limit leaves out of an
    -- aggregate is its last events (rows locked beyond it are let go at the end of the claim's
    -- transaction). A row that two paths found (a run's past the walk, say) counts once.
    SELECT DISTINCT ON (u.id) u.id, u.stale,
           u.stale AND u.retry_count + 1 >= u.max_retries AS exhausting,
           {schema}.postbox_is_ordered(u.aggregate_type, u.aggregate_id, $5) AS ordered,
           u.aggregate_type, u.aggregate_id, u.headed
    FROM (SELECT * FROM retried UNION ALL SELECT * FROM fresh UNION ALL SELECT * FROM deep
          UNION ALL SELECT * FROM wide UNION ALL SELECT * FROM taken
          UNION ALL SELECT * FROM spread UNION ALL SELECT * FROM loose
          UNION ALL SELECT * FROM onward) u
    ORDER BY u.id, u.headed DESC
    LIMIT $1
), counted AS MATERIALIZED (
    -- Per row, how many rows of its aggregate this claim holds: a sort of the batch.
    SELECT w.*, count(*) OVER (PARTITION BY w.aggregate_type, w.aggregate_id) AS m
    FROM walked w
), grouped AS MATERIALIZED (
    -- The ordered aggregates with more than one row here, their rows in id order.
    SELECT c.aggregate_type, c.aggregate_id, array_agg(c.id ORDER BY c.id) AS ids,
           array_agg(c.stale ORDER BY c.id) AS stale, array_agg(c.exhausting ORDER BY c.id) AS ex
    FROM counted c
    WHERE c.ordered AND c.m > 1
    GROUP BY c.aggregate_type, c.aggregate_id
), checked AS MATERIALIZED (
    -- Of each of those, the longest run of its rows here that are its first unfinished events
    -- (FAILED ones included: a parked head), read once through the aggregate index, and that
    -- follow no event this claim fails (its last try): the events it may take, in order (G6).
    -- Rows past a gap (an event another relay has in flight, backing off, parked) wait.
    SELECT g.ids, g.stale,
           (SELECT coalesce(min(i) - 1, cardinality(g.ids))
            FROM (SELECT array_agg(b.id ORDER BY b.id) AS ids
                  FROM (SELECT b.id FROM {schema}.outbox_events b
                        WHERE b.aggregate_type = g.aggregate_type
                          AND b.aggregate_id = g.aggregate_id
                          AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                          AND b.skipped_at IS NULL
                        ORDER BY b.aggregate_type, b.aggregate_id, b.id
                        LIMIT cardinality(g.ids)) b) f
            CROSS JOIN LATERAL generate_series(
                1, greatest(cardinality(g.ids), cardinality(f.ids))) i
            WHERE g.ids[i] IS DISTINCT FROM f.ids[i] OR (i > 1 AND g.ex[i - 1])) AS n
    FROM grouped g
), picked AS (
    -- What is not ordered; an ordered aggregate's one row here when it is the aggregate's first
    -- unfinished event (known from wide; otherwise one probe); the runs checked above.
    SELECT c.id, c.stale
    FROM counted c
    WHERE NOT c.ordered
       OR (c.m = 1 AND c.headed)
       OR (c.m = 1
           AND c.id = (SELECT b.id FROM {schema}.outbox_events b
                       WHERE b.aggregate_type = c.aggregate_type
                         AND b.aggregate_id = c.aggregate_id
                         AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                         AND b.skipped_at IS NULL
                       ORDER BY b.aggregate_type, b.aggregate_id, b.id
                       LIMIT 1))
    UNION ALL
    SELECT k.id, k.stale
    FROM checked c
    CROSS JOIN LATERAL unnest(c.ids[1:c.n], c.stale[1:c.n]) k(id, stale)
)
-- The picked rows, then taken by id (postbox_claim_take).
SELECT coalesce(array_agg(p.id), '{}'), coalesce(array_agg(p.id) FILTER (WHERE p.stale), '{}')
INTO ids, stale_ids
FROM picked p;
RETURN QUERY
SELECT * FROM {schema}.postbox_claim_take(ids, stale_ids, $2, $3, $4, $7);
END
$claim$;
