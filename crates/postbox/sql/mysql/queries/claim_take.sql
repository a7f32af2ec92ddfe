-- The second step of the claim: takes the picked rows ({ids}) under this relay's lease. A row
-- still PROCESSING is a stale claim: its lost lease counts as a failed try, and on its last try it
-- goes FAILED instead. Each expression reads the old values of the columns assigned after it
-- (MySQL assigns left to right): status and retry_count are assigned last.
-- Binds: a stale event's last_error ({relay} for the relay that held it: store::LEASE_EXPIRED),
-- lease µs, relay id, claim token, then the ids.
UPDATE outbox_events
SET last_error   = IF(status = 'PROCESSING',
                      REPLACE(?, '{relay}', COALESCE(locked_by, '?')), last_error),
    locked_until = IF(status = 'PROCESSING' AND retry_count + 1 >= max_retries, NULL,
                      UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND),
    locked_by    = ?,
    claim_token  = ?,
    updated_at   = UTC_TIMESTAMP(6),
    retry_count  = retry_count + (status = 'PROCESSING'),
    status       = IF(status = 'PROCESSING' AND retry_count >= max_retries, 'FAILED',
                      'PROCESSING')
WHERE id IN ({ids})
