-- A dry run of purge_failed.sql: how many FAILED events have a last try more than ?1 seconds old.
SELECT count(*) FROM outbox_events
WHERE status = 'FAILED' AND julianday(updated_at) < julianday('now') - ?1 / 86400.0
