-- The archived events ({ids}) removed from the table.
DELETE FROM outbox_events WHERE status = 'PROCESSED' AND id IN ({ids})
