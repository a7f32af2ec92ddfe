-- One batch of inbox rows received more than ? µs ago deleted, oldest first.
-- Binds: age µs, batch size.
DELETE FROM inbox_messages
WHERE received_at < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND
ORDER BY received_at
LIMIT ?
