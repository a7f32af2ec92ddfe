-- Events by status, PROCESSED counted up to ? rows (past that the store estimates), and the age
-- in seconds of the oldest outstanding event. Each count reads its own range of (status, id).
SELECT (SELECT count(*) FROM outbox_events WHERE status = 'PENDING'),
       (SELECT count(*) FROM outbox_events WHERE status = 'PROCESSING'),
       (SELECT count(*) FROM (SELECT 1 FROM outbox_events WHERE status = 'PROCESSED' LIMIT ?) p),
       (SELECT count(*) FROM outbox_events WHERE status = 'FAILED'),
       (SELECT TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) / 1e6
        FROM outbox_events WHERE status IN ('PENDING', 'PROCESSING'))
