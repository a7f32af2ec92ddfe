-- Whether an event of an ordered aggregate must wait (postbox_waiting, as one boolean): for the
-- eight-argument claim, which probes row by row.
CREATE OR REPLACE FUNCTION {schema}.postbox_waits_in_order(agg_type text, agg_id text,
                                                           event_id bigint, ordered text[],
                                                           settled bigint)
RETURNS boolean
LANGUAGE sql
STABLE
AS $waits$
SELECT EXISTS (SELECT FROM {schema}.postbox_waiting(agg_type, agg_id, event_id, ordered, settled))
$waits$;
