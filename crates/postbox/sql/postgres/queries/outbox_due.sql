-- One schema's line of Store::outbox_due: its backlog as functions/postbox_backlog.sql reads it
-- (seconds until an outstanding event is due, 0: now, NULL: nothing outstanding). The store joins
-- one line per target with UNION ALL, a few hundred per statement; {n} is the target's place in
-- the list (a number the store writes), {ordered} empty or $1, the ordered aggregate types.
SELECT {n}::integer AS n, {schema}.postbox_backlog({ordered}) AS due
