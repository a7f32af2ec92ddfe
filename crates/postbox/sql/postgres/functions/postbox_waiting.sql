-- Whether an event of an ordered aggregate must wait: it is above the commit horizon `settled`,
-- or an earlier event of its aggregate cannot be claimed now (FAILED and not skipped, in flight,
-- backing off). One row (true) when it waits, none when it does not: a set-returning SQL
-- function with one SELECT is inlined where it is read (EXISTS (SELECT FROM postbox_waiting(…))).
CREATE OR REPLACE FUNCTION {schema}.postbox_waiting(agg_type text, agg_id text, event_id bigint,
                                         ordered text[], settled bigint)
RETURNS SETOF boolean
LANGUAGE sql
STABLE
AS $waiting$
SELECT true
WHERE {schema}.postbox_is_ordered(agg_type, agg_id, ordered)
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
$waiting$;
