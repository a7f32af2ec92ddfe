-- How many inbox rows were received more than ? µs ago (a dry run of inbox_purge.sql).
SELECT count(*) FROM inbox_messages
WHERE received_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
