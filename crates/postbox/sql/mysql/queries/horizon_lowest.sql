-- The lowest committed id in the table (a consistent read; NULL when empty): below it, any row
-- of outbox_events is one an open transaction inserted and has not committed.
SELECT MIN(id) FROM outbox_events
