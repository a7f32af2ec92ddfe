-- How many FAILED events had their last try more than ? µs ago (a dry run of purge_failed.sql).
SELECT count(*) FROM outbox_events
WHERE updated_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND AND status = 'FAILED'
