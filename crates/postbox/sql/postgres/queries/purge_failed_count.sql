-- A dry run of purge_failed.sql: how many FAILED events have a last try more than $1 seconds old.
SELECT count(*) FROM {schema}.outbox_events
WHERE status = 'FAILED' AND updated_at < now() - $1::float8 * interval '1 second'
