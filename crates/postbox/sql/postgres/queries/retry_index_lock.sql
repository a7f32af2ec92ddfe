-- One build of schema $1's retry index at a time (several relays or migrations at once): false
-- when another session is building it. Not waited for: a concurrent build waits for every
-- transaction of the database, a waiting lock request's among them. The lock is the session's
-- and goes with the connection. $2: the key, postbox::store::pg_locks::RETRY_INDEX.
SELECT pg_try_advisory_lock($2, hashtext($1))
