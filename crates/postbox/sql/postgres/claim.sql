-- One short claim (DESIGN §3): due rows in id order, rows other relays hold are skipped. A row
-- still PROCESSING here is a stale claim of a relay that did not finish within its lease: taking
-- it over counts as a failed try, and on its last try it goes FAILED instead.
-- $1 batch size, $2 lease in ms, $3 relay id, $4 claim token
WITH picked AS (
    SELECT id, status = 'PROCESSING' AS stale
    FROM {schema}.outbox_events
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_events AS e
SET status       = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = e.retry_count + CASE WHEN p.stale THEN 1 ELSE 0 END,
    last_error   = CASE WHEN p.stale
                        THEN 'lease expired: relay ' || coalesce(e.locked_by, '?')
                             || ' did not finish publishing in time (crashed or stalled)'
                        ELSE e.last_error END,
    locked_until = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries THEN NULL
                        ELSE now() + $2::float8 * interval '1 millisecond' END,
    locked_by    = $3,
    claim_token  = $4,
    updated_at   = now()
FROM picked p
WHERE e.id = p.id
RETURNING e.id, p.stale, e.status = 'FAILED' AS exhausted, e.event_type, e.aggregate_type,
          e.aggregate_id, e.idempotency_key, e.payload::text, e.headers, e.event_class,
          e.schema_version, e.retry_count, e.max_retries, e.created_at, e.last_error
