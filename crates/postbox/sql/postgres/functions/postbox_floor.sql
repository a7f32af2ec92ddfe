-- The floor of a relay's next claims (postbox_claim): from its last floor `from_id`, the first event
-- that is in flight or waiting without having gone wrong (last_error NULL), but never above
-- `up_to`, the commit horizon + 1. Reads from the last floor to that event: what was done since
-- the last call, not the history. From 0 (a relay's first claim, and its sweep every minute) it
-- reads the polling index from its start, through a statement of its own: a range from 0 could
-- be read through the primary key instead, which holds the history, when statistics taken
-- while a backlog was pending make both look alike.
CREATE OR REPLACE FUNCTION {schema}.postbox_floor(from_id bigint, up_to bigint)
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
