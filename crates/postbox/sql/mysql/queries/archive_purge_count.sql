-- How many archived events are older than ? µs (a dry run of purge_archive.sql).
SELECT count(*) FROM outbox_events_archive
WHERE archived_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
