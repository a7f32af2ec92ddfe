-- The floor of a relay's next claims (see claim_pick.sql): from its last floor (?, twice), the
-- first event that is in flight or waiting without having gone wrong (last_error NULL); the
-- relay caps it at the commit horizon + 1. Reads each status range of (status, id) from the last
-- floor to that event: what was done since the last call, not the history. NULL when there is
-- none.
SELECT MIN(f.id) FROM (
    (SELECT id FROM outbox_events FORCE INDEX (outbox_events_status_idx)
     WHERE status = 'PENDING' AND id >= ? AND last_error IS NULL
     ORDER BY id LIMIT 1)
    UNION ALL
    (SELECT id FROM outbox_events FORCE INDEX (outbox_events_status_idx)
     WHERE status = 'PROCESSING' AND id >= ? AND last_error IS NULL
     ORDER BY id LIMIT 1)
) f
