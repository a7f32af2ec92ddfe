-- A locking read of an id missing from the table (?) that does not wait: it fails when an open
-- transaction holds the row (it inserted it and has not committed), and finds nothing when the id
-- was rolled back or purged.
SELECT id FROM outbox_events WHERE id = ? FOR UPDATE NOWAIT
