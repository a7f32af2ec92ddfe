-- A heartbeat in the WAL: a non-transactional logical message, which the slot delivers at
-- once; while nothing of the outbox is unrecorded, its position is confirmed, so the slot
-- advances past what other tables wrote.
SELECT pg_logical_emit_message(false, 'postbox-heartbeat', '')::text
