-- Drops a retry index whose concurrent build did not finish (it is INVALID: unused by queries,
-- but kept up to date by every write). Run outside a transaction.
DROP INDEX CONCURRENTLY IF EXISTS {schema}.outbox_events_retry_idx
