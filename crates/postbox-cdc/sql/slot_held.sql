-- Whether another connection reads the slot $1 now: a relay starting beside it is a standby
-- from its first claim on (it leaves the slot's events to that reader).
SELECT EXISTS (
    SELECT 1 FROM pg_replication_slots
    WHERE slot_name = $1 AND active AND active_pid IS DISTINCT FROM pg_backend_pid()
)
