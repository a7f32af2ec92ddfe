-- One relay vacuums a table (schema $1) at a time; the others skip it. The lock is the session's,
-- so it goes with the connection.
SELECT pg_try_advisory_lock(7012027, hashtext($1))
