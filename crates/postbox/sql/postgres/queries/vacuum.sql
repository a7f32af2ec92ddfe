-- Removes the dead row versions marks leave (see relay/vacuum.rs). Runs outside a transaction.
-- INDEX_CLEANUP ON: the default may skip the indexes when few heap pages hold dead rows, yet the
-- dead entries of the polling index are what slow claims down. TRUNCATE OFF: truncating the
-- table's tail takes a lock that would stop claims for a moment. No SKIP_LOCKED: when an
-- autovacuum worker (slowed down by its cost limits) holds the table, this waits, and
-- PostgreSQL cancels the autovacuum after deadlock_timeout in its favour.
VACUUM (INDEX_CLEANUP ON, TRUNCATE OFF) {schema}.outbox_events
