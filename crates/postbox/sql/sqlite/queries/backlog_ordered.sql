-- Seconds until an outstanding event can be claimed (0: now), NULL when nothing is outstanding,
-- for a relay with ordered aggregate types (?1, a JSON array): an ordered event held back by a
-- FAILED (parked) or in-flight earlier event of its aggregate is not claimable, and only events
-- that come due by themselves (a lease, a backoff) are waited for.
SELECT CASE
    WHEN EXISTS (
        SELECT 1 FROM outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')
          AND (e.locked_until IS NULL OR e.locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
          AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL
               OR NOT EXISTS (SELECT 1 FROM json_each(?1) AS o
                              WHERE o.value = '*' OR o.value = e.aggregate_type)
               OR NOT EXISTS (
                   SELECT 1 FROM outbox_events b
                   WHERE b.aggregate_type = e.aggregate_type
                     AND b.aggregate_id = e.aggregate_id
                     AND b.id < e.id
                     AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                     AND b.skipped_at IS NULL)))
    THEN 0.0
    ELSE (SELECT max(0.0, (julianday(min(locked_until)) - julianday('now')) * 86400.0)
          FROM outbox_events
          WHERE status IN ('PENDING', 'PROCESSING')
            AND locked_until >= strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
END
