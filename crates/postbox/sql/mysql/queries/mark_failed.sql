-- One failed try: back to PENDING after the backoff min(cap, base * 2^(retry_count + 1)) on the
-- database clock, or FAILED when permanent or at the retry limit. MySQL assigns left to right,
-- each expression seeing the columns set before it: retry_count is read, then raised last.
-- Binds: permanent, max_retries override (NULL keeps the column's), cap µs, base µs, permanent,
-- max_retries override, max_retries override, error, id, claim token.
UPDATE outbox_events
SET locked_until = IF(? OR retry_count + 1 >= COALESCE(?, max_retries), NULL,
                      UTC_TIMESTAMP(6) + INTERVAL CAST(LEAST(?, ? * POW(2, LEAST(retry_count + 1, 40)))
                                                       AS SIGNED) MICROSECOND),
    status       = IF(? OR retry_count + 1 >= COALESCE(?, max_retries), 'FAILED', 'PENDING'),
    max_retries  = COALESCE(?, max_retries),
    last_error   = ?,
    updated_at   = UTC_TIMESTAMP(6),
    retry_count  = retry_count + 1
WHERE id = ? AND claim_token = ? AND status = 'PROCESSING'
