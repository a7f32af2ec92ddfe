-- What a draining relay still has to wait for: 0 when an event can be claimed now, else the
-- seconds until the earliest lease or backoff runs out, NULL when nothing is outstanding. It
-- walks the polling index from the head of the queue to the first event still to do, then
-- stops at the first claimable one (past the batches other relays hold); the minimum over every
-- outstanding event is taken only when none is claimable, when all of them are in flight or
-- waiting for a retry.
-- Sequential and bitmap scans are off so that statistics saying "most rows are due" cannot turn
-- the probe into a scan of the whole table from its oldest, processed, rows.
-- A probe gives up on a lock after half a second (SQLSTATE 55P03, lock_not_available): a table
-- locked for long (VACUUM FULL, a migration's ALTER TABLE waiting behind a long query, LOCK
-- TABLE) fails its own probe, not the due sweep that reads a hundred tenants in one statement
-- (the relay then reads each on its own and looks at the locked one again at the next sweep).
-- The one without ordered types is PL/pgSQL, whose plan a session keeps: the due sweep calls it
-- once per tenant per statement, and an SQL function with SET options is planned at every call
-- (0.27 ms of the server's time against about 0.05).
CREATE OR REPLACE FUNCTION {schema}.postbox_backlog()
RETURNS double precision
LANGUAGE plpgsql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET lock_timeout = '500ms'
AS $backlog$
DECLARE
    first_id bigint;
BEGIN
    SELECT e.id INTO first_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
    ORDER BY e.id
    LIMIT 1;
    IF first_id IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT CASE
        WHEN EXISTS (SELECT 1 FROM {schema}.outbox_events e
                     WHERE e.status IN ('PENDING', 'PROCESSING') AND e.id >= first_id
                       AND (e.locked_until IS NULL OR e.locked_until < now()))
        THEN 0.0::float8
        ELSE (SELECT EXTRACT(EPOCH FROM min(e.locked_until) - now())::float8
              FROM {schema}.outbox_events e
              WHERE e.status IN ('PENDING', 'PROCESSING') AND e.id >= first_id)
    END);
END
$backlog$;

CREATE OR REPLACE FUNCTION {schema}.postbox_backlog(ordered text[])
RETURNS double precision
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
SET lock_timeout = '500ms'
AS $backlog$
WITH RECURSIVE aggregates(aggregate_type, aggregate_id) AS (
    (SELECT e.aggregate_type, e.aggregate_id
     FROM {schema}.outbox_events e
     WHERE e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
       AND e.aggregate_id IS NOT NULL AND e.aggregate_type IS NOT NULL
     ORDER BY e.aggregate_type DESC, e.aggregate_id DESC, e.id DESC
     LIMIT 1)
    UNION ALL
    SELECT n.aggregate_type, n.aggregate_id
    FROM aggregates p
    CROSS JOIN LATERAL (
        SELECT e.aggregate_type, e.aggregate_id
        FROM {schema}.outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
          AND e.aggregate_id IS NOT NULL
          AND (e.aggregate_type, e.aggregate_id) < (p.aggregate_type, p.aggregate_id)
        ORDER BY e.aggregate_type DESC, e.aggregate_id DESC, e.id DESC
        LIMIT 1) n
)
SELECT CASE
    WHEN EXISTS (
        SELECT 1 FROM {schema}.outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')
          AND (e.locked_until IS NULL OR e.locked_until < now())
          AND NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, ordered))
      OR EXISTS (
        SELECT 1
        FROM aggregates a
        CROSS JOIN LATERAL (
            SELECT e.status, e.locked_until
            FROM {schema}.outbox_events e
            WHERE e.aggregate_type = a.aggregate_type AND e.aggregate_id = a.aggregate_id
              AND e.status IN ('PENDING', 'PROCESSING', 'FAILED') AND e.skipped_at IS NULL
            ORDER BY e.aggregate_type, e.aggregate_id, e.id
            LIMIT 1) h
        WHERE {schema}.postbox_is_ordered(a.aggregate_type, a.aggregate_id, ordered)
          AND h.status IN ('PENDING', 'PROCESSING')
          AND (h.locked_until IS NULL OR h.locked_until < now()))
    THEN 0.0::float8
    ELSE (SELECT EXTRACT(EPOCH FROM min(locked_until) - now())::float8
          FROM {schema}.outbox_events
          WHERE status IN ('PENDING', 'PROCESSING') AND locked_until >= now())
END
$backlog$;

-- postbox_backlog() of a relay that knows where its claims start (no ordered aggregate types):
-- from its floor `from_id` on through the polling index, below it what went wrong (the retry
-- index: a failed try backing off, an event put back, a lease taken over) and the ranges of
-- ids it passed while a transaction held the commit horizon back (`passed_lo`, `passed_hi`:
-- their first and last ids), each looked up by id. Below the floor nothing else waits but an
-- event put back by hand, which the relay's floor sweep finds. What a transaction held open
-- keeps of the events done since it began (the index entries of their old versions) is walked
-- once, to the first event still to do, not once to find none claimable and again for the
-- earliest lease.
CREATE OR REPLACE FUNCTION {schema}.postbox_backlog(from_id bigint, passed_lo bigint[],
                                                    passed_hi bigint[])
RETURNS double precision
LANGUAGE plpgsql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET lock_timeout = '500ms'
AS $backlog$
DECLARE
    first_id bigint;
    next_at timestamptz;
BEGIN
    SELECT e.id INTO first_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING') AND e.id >= from_id
    ORDER BY e.id
    LIMIT 1;
    IF (first_id IS NOT NULL
        AND EXISTS (SELECT 1 FROM {schema}.outbox_events e
                    WHERE e.status IN ('PENDING', 'PROCESSING') AND e.id >= first_id
                      AND (e.locked_until IS NULL OR e.locked_until < now())))
       OR EXISTS (SELECT 1 FROM {schema}.outbox_events e
                  WHERE e.last_error IS NOT NULL AND e.status <> 'PROCESSED'
                    AND e.status <> 'FAILED'
                    AND coalesce(e.locked_until, '-infinity'::timestamptz) < now())
       OR EXISTS (SELECT 1
                  FROM unnest(passed_lo, passed_hi) AS r(lo, hi)
                  JOIN {schema}.outbox_events e ON e.id BETWEEN r.lo AND r.hi
                  WHERE e.status IN ('PENDING', 'PROCESSING')
                    AND (e.locked_until IS NULL OR e.locked_until < now()))
    THEN
        RETURN 0.0::float8;
    END IF;
    -- Nothing claimable: when the first lease or backoff runs out (NULL: nothing outstanding).
    SELECT min(m.at) INTO next_at
    FROM (SELECT min(e.locked_until) AS at
          FROM {schema}.outbox_events e
          WHERE first_id IS NOT NULL
            AND e.status IN ('PENDING', 'PROCESSING') AND e.id >= first_id
          UNION ALL
          SELECT min(coalesce(e.locked_until, '-infinity'::timestamptz))
          FROM {schema}.outbox_events e
          WHERE e.last_error IS NOT NULL AND e.status <> 'PROCESSED' AND e.status <> 'FAILED'
          UNION ALL
          SELECT min(e.locked_until)
          FROM unnest(passed_lo, passed_hi) AS r(lo, hi)
          JOIN {schema}.outbox_events e ON e.id BETWEEN r.lo AND r.hi
          WHERE e.status IN ('PENDING', 'PROCESSING')) m;
    RETURN EXTRACT(EPOCH FROM next_at - now())::float8;
END
$backlog$;
