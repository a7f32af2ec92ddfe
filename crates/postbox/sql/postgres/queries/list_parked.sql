-- The head of a parked aggregate (G6), a condition on a row of outbox_events: FAILED, not
-- skipped, and a later event of its aggregate still waits behind it.
status = 'FAILED' AND skipped_at IS NULL AND aggregate_id IS NOT NULL
AND EXISTS (SELECT 1 FROM {schema}.outbox_events l
            WHERE l.aggregate_type = outbox_events.aggregate_type
              AND l.aggregate_id = outbox_events.aggregate_id AND l.id > outbox_events.id
              AND l.status IN ('PENDING', 'PROCESSING'))
