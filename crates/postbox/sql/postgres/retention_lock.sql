-- Takes the retention lock of a schema's ($1) outbox for the rest of the transaction, without
-- waiting: archiving and purging run one at a time per table (relays and commands alike).
SELECT pg_try_advisory_xact_lock(hashtext('postbox_retention'), hashtext($1))
