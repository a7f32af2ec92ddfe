-- The ids between the horizon so far (?) and the last id handed out (?) that are in the table or
-- the archive: committed ones. Binds: from, to, from, to.
SELECT id FROM outbox_events WHERE id > ? AND id <= ?
UNION ALL
SELECT id FROM outbox_events_archive WHERE id > ? AND id <= ?
