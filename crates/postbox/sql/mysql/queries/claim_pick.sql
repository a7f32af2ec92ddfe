-- The first step of the claim (docs/architecture.md, "The contract"), new work: the claimable rows of one status range
-- (? PENDING or PROCESSING, each read in id order from its own range of (status, id): MySQL has
-- no partial index) at or above the relay's floor (?), locked, rows other relays hold skipped.
-- The floor (claim_floor.sql) keeps the claim from walking the entries the marks left behind in
-- (status, id), which InnoDB cannot purge while a long transaction is open; below it the claim
-- takes only events that went wrong once (claim_retried.sql). The claim merges the ranges and
-- keeps the first batch size of them, in id order.
--
-- Per-aggregate ordering (G6) is claim_in_order.sql, written in where its marker stands. Earlier
-- claimable events of an aggregate come first in id order; the claim then checks they are really
-- its own (claim_heads.sql).
-- Binds: status, floor, ordered types, ordered types, horizon, batch size.
SELECT e.id, e.status = 'PROCESSING' AS stale, e.aggregate_type, e.aggregate_id
FROM outbox_events e
WHERE e.status = ?
  AND e.id >= ?
  AND (e.locked_until IS NULL OR e.locked_until < UTC_TIMESTAMP(6))
  AND {in_order}
ORDER BY e.id
LIMIT ?
FOR UPDATE SKIP LOCKED
