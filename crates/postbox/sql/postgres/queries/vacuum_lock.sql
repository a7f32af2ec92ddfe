-- One relay vacuums a table (schema $1) at a time; the others skip it. The lock is the session's,
-- so it goes with the connection. $2: the key, postbox::store::pg_locks::VACUUM.
SELECT pg_try_advisory_lock($2, hashtext($1))
