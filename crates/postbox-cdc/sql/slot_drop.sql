-- Drops the slot $1 when nobody reads it (a lost slot is recreated by the next start).
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = $1 AND NOT active
