-- The claim's path below the relay's floor (?): due events that went wrong once — a failed try
-- backing off, an event put back while its destination was down, a lease taken over, an
-- operator's retry, the slow lane — found through outbox_events_retry_idx on the virtual
-- retry_due (0002_retry_due.sql: NULL for every other event), in due order, locked, rows other
-- relays hold skipped. Events without last_error below the floor cannot be unfinished: the
-- floor never passes one that is in flight or waiting, nor the commit horizon.
-- Per-aggregate ordering (G6) is claim_in_order.sql, written in where its marker stands.
-- Binds: floor, ordered types, ordered types, horizon, batch size.
SELECT e.id, e.status = 'PROCESSING' AS stale, e.aggregate_type, e.aggregate_id
FROM outbox_events e
WHERE e.retry_due < UTC_TIMESTAMP(6)
  AND e.id < ?
  AND {in_order}
ORDER BY e.retry_due
LIMIT ?
FOR UPDATE SKIP LOCKED
