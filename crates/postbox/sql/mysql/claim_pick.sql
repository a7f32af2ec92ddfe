-- The first step of the claim (DESIGN §3): the claimable rows of one status range (? PENDING or
-- PROCESSING, each read in id order from its own range of (status, id): MySQL has no partial
-- index), locked, rows other relays hold skipped. The claim merges both ranges and keeps the
-- first batch size of them.
--
-- Per-aggregate ordering (G6), ? the ordered aggregate types as a JSON array ("*" for all, empty
-- for none): an ordered event is claimable only at or below the commit horizon (?), and when no
-- earlier event of its aggregate is unfinished and not claimable now (FAILED and not skipped, in
-- flight, backing off, or stale on its last try). Earlier claimable ones come first in id order;
-- the claim then checks they are really its own (claim_heads.sql).
-- Binds: status, ordered types, ordered types, horizon, batch size.
SELECT e.id, e.status = 'PROCESSING' AS stale, e.aggregate_type, e.aggregate_id
FROM outbox_events e
WHERE e.status = ?
  AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6))
  AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL
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
ORDER BY e.id
LIMIT ?
FOR UPDATE SKIP LOCKED
