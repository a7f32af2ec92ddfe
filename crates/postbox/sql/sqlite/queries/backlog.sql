-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding.
SELECT max(0.0, (julianday(min(coalesce(locked_until, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))))
                 - julianday('now')) * 86400.0)
FROM outbox_events
WHERE status IN ('PENDING', 'PROCESSING')
