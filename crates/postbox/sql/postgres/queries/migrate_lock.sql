-- Serializes concurrent migrations of one schema ($1) for the rest of the transaction (several
-- relays starting at once). $2: the key, postbox::store::pg_locks::MIGRATE.
SELECT pg_advisory_xact_lock($2, hashtext($1))
