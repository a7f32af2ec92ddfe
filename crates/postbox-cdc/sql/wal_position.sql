-- The server's current WAL position, as a number (the relay's start: what was committed before
-- it is the slot's to name first).
SELECT (pg_current_wal_lsn() - '0/0')::bigint
