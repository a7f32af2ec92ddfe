SELECT count(*) FILTER (WHERE status = 'PENDING'),
       count(*) FILTER (WHERE status = 'PROCESSING'),
       count(*) FILTER (WHERE status = 'PROCESSED'),
       count(*) FILTER (WHERE status = 'FAILED'),
       (julianday('now') - julianday(min(created_at) FILTER (WHERE status IN ('PENDING', 'PROCESSING')))) * 86400.0,
       NULL
FROM outbox_events
