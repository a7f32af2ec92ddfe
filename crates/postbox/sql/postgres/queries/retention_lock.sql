-- Takes the retention lock of a schema's ($1) outbox for the rest of the transaction, without
-- waiting: archiving and purging run one at a time per table (relays and commands alike).
-- $2: the lock's name, postbox::store::pg_locks::RETENTION.
SELECT pg_try_advisory_xact_lock(hashtext($2), hashtext($1))
