-- The backlog of a relay with ordered aggregate types (what `relay --drain` waits for when a
-- claim came back empty), found from the aggregates' heads instead of from every waiting event.
--
-- 0007's postbox_backlog(ordered) looked for a due event whose aggregate had no earlier
-- unfinished event by walking the due events in id order, with a probe of its aggregate each:
-- while every aggregate had an event in flight, it read the whole backlog to find nothing
-- (196 ms for 30,000 events over 100 aggregates), and every draining relay whose claim came back
-- empty paid that again at each of its waits. Now:
-- - a due event that is not ordered (no aggregate, or a type not in `ordered`) is found in id
--   order, without a probe;
-- - an ordered one is found among the heads of the aggregates with unfinished events, by the
--   loose scan of outbox_events_aggregate_idx the claim makes (one descent per aggregate, from
--   the index's end, stopping at the first ready head); a head is ready when it is due.
-- Its cost is the aggregates', not the waiting events'. Same signature and answer as 0007's:
-- relays of the previous release call it unchanged during a rolling upgrade. No table is
-- touched: no lock blocks producers or relays.

CREATE OR REPLACE FUNCTION {schema}.postbox_backlog(ordered text[])
RETURNS double precision
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
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
