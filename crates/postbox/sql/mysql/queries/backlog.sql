-- What a draining relay still has to wait for: 0 when an event can be claimed now, else the
-- seconds until the earliest lease or backoff runs out, NULL when nothing is outstanding. With
-- ordered aggregate types (? a JSON array, twice; "*" for all, empty for none), an ordered event
-- held back by a FAILED (parked) or in-flight earlier event of its aggregate is not claimable.
SELECT CASE
    WHEN EXISTS (
        SELECT 1 FROM outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')
          AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6))
          AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL
               OR NOT (JSON_CONTAINS(?, '"*"') OR JSON_CONTAINS(?, JSON_QUOTE(e.aggregate_type)))
               OR NOT EXISTS (
                   SELECT 1 FROM outbox_events b
                   WHERE b.aggregate_type = e.aggregate_type
                     AND b.aggregate_id = e.aggregate_id
                     AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.id < e.id
                     AND b.skipped_at IS NULL)))
    THEN 0.0
    ELSE (SELECT GREATEST(0.0, TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(locked_until)) / 1e6)
          FROM outbox_events
          WHERE status IN ('PENDING', 'PROCESSING') AND locked_until >= UTC_TIMESTAMP(6))
END
