-- One failed try. ?1 id, ?2 error, ?3 permanent, ?4 claim token, ?5 backoff base ms, ?6 cap ms,
-- ?7 max_retries overriding the column (a retry policy), NULL to keep the column's; the column
-- takes the policy's value, so that the slow lane and `events show` count from it.
-- Backoff: min(cap, base * 2^retry_count).
UPDATE outbox_events
SET retry_count  = retry_count + 1,
    max_retries  = COALESCE(?7, max_retries),
    status       = CASE WHEN ?3 OR retry_count + 1 >= COALESCE(?7, max_retries)
                        THEN 'FAILED' ELSE 'PENDING' END,
    locked_until = CASE WHEN ?3 OR retry_count + 1 >= COALESCE(?7, max_retries) THEN NULL
                        ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds',
                             min(?6, ?5 * (1 << min(retry_count + 1, 40))) / 1000.0)) END,
    last_error   = ?2,
    updated_at   = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id = ?1 AND claim_token = ?4 AND status = 'PROCESSING'
RETURNING id, retry_count, status = 'FAILED'
