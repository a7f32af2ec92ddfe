-- $1 ids, $2 errors, $3 permanent flags, $4 claim token, $5 backoff base in ms, $6 cap in ms,
-- $7 per-event max_retries overriding the column (a retry policy), NULL to keep the column's; the
-- column takes the policy's value, so that the slow lane and `events show` count from it.
-- Backoff: min(cap, base * 2^retry_count), counted from the database clock; the exponent stops at
-- 40 (any cap is reached long before), so events retried for a long time cannot overflow it.
UPDATE {schema}.outbox_events AS e
SET retry_count  = e.retry_count + 1,
    max_retries  = COALESCE(f.max_retries, e.max_retries),
    status       = CASE WHEN f.permanent OR e.retry_count + 1 >= COALESCE(f.max_retries, e.max_retries)
                        THEN 'FAILED' ELSE 'PENDING' END,
    locked_until = CASE WHEN f.permanent OR e.retry_count + 1 >= COALESCE(f.max_retries, e.max_retries)
                        THEN NULL
                        ELSE now() + LEAST($6::float8, $5::float8 * power(2::float8, LEAST(e.retry_count + 1, 40)))
                                     * interval '1 millisecond' END,
    last_error   = f.error,
    updated_at   = now()
FROM unnest($1::bigint[], $2::text[], $3::bool[], $7::int[]) AS f(id, error, permanent, max_retries)
WHERE e.id = f.id AND e.claim_token = $4 AND e.status = 'PROCESSING'
RETURNING e.id, e.retry_count, e.status = 'FAILED'
