-- Due rows in id order; the claim runs in a BEGIN IMMEDIATE transaction, which SQLite serializes,
-- so no row can be picked twice. ?1 batch size, ?2 the ordered aggregate types (a JSON array; "*"
-- for all, empty for none). Ids are drawn in commit order here (one writer at a time): no commit
-- horizon is needed.
-- With ordering (G6), an ordered event is picked only when no earlier event of its aggregate is
-- unfinished and unclaimable now (FAILED and not skipped, in flight, backing off). Earlier
-- claimable ones come first in id order and are picked before it, unless the batch is full: then it is not picked either, as the LIMIT cuts
-- the walk in id order. A stale earlier event on its last try goes FAILED in this claim: its
-- aggregate's later events are left for the next claim, where it holds them back.
SELECT e.id, e.status = 'PROCESSING' AS stale
FROM outbox_events e
WHERE e.status IN ('PENDING', 'PROCESSING')
  AND (e.locked_until IS NULL OR e.locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
  AND (e.aggregate_id IS NULL OR e.aggregate_type IS NULL
       OR NOT EXISTS (SELECT 1 FROM json_each(?2) AS o
                      WHERE o.value = '*' OR o.value = e.aggregate_type)
       OR NOT EXISTS (
           SELECT 1 FROM outbox_events b
           WHERE b.aggregate_type = e.aggregate_type
             AND b.aggregate_id = e.aggregate_id
             AND b.id < e.id
             AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
             AND b.skipped_at IS NULL
             AND NOT (b.status = 'PENDING'
                      AND (b.locked_until IS NULL
                           OR b.locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))
             AND NOT (b.status = 'PROCESSING'
                      AND b.locked_until < strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                      AND b.retry_count + 1 < b.max_retries)))
ORDER BY e.id
LIMIT ?1
