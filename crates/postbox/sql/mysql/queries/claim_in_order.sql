-- Whether event e may be claimed as far as per-aggregate ordering goes (G6); a fragment of
-- claim_pick.sql and claim_retried.sql, written once. ? the ordered aggregate types as a JSON array
-- ("*" for all, empty for none), twice; ? the commit horizon. An ordered event is claimable only
-- at or below the commit horizon, and when no earlier event of its aggregate is unfinished and
-- not claimable now (FAILED and not skipped, in flight, backing off, or stale on its last try).
(e.aggregate_id IS NULL OR e.aggregate_type IS NULL
 OR NOT (JSON_CONTAINS(?, '"*"') OR JSON_CONTAINS(?, JSON_QUOTE(e.aggregate_type)))
 OR (e.id <= ?
     AND NOT EXISTS (
         SELECT 1 FROM outbox_events b
         WHERE b.aggregate_type = e.aggregate_type AND b.aggregate_id = e.aggregate_id
           AND b.status IN ('PENDING', 'PROCESSING', 'FAILED') AND b.id < e.id
           AND b.skipped_at IS NULL
           AND NOT (b.status = 'PENDING'
                    AND (b.locked_until IS NULL OR b.locked_until < UTC_TIMESTAMP(6)))
           AND NOT (b.status = 'PROCESSING' AND b.locked_until < UTC_TIMESTAMP(6)
                    AND b.retry_count + 1 < b.max_retries))))
