SELECT count(*),
       max(0.0, (julianday(min(coalesce(locked_until, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))))
                 - julianday('now')) * 86400.0)
FROM outbox_events
WHERE status IN ('PENDING', 'PROCESSING')
