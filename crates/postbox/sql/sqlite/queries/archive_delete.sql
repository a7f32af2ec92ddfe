-- One batch of retention, last step: the events archive_move.sql copied leave the table.
DELETE FROM outbox_events
WHERE id IN (SELECT value FROM json_each(?1)) AND status = 'PROCESSED'
