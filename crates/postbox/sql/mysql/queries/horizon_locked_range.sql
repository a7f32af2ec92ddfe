-- A locking read of ids ? to ? that does not wait, where the table has no committed row: it
-- fails when an open transaction holds one of them (it inserted the row and has not committed).
-- It may also fail on the committed row just past the range while a claim holds it, which only
-- makes the horizon wait a little longer.
SELECT id FROM outbox_events WHERE id >= ? AND id <= ? ORDER BY id LIMIT 1 FOR UPDATE NOWAIT
