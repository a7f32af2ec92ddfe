-- Takes the picked rows (a JSON array of ids in ?1). A row still PROCESSING is a stale claim: its
-- lost lease counts as a failed try, and on its last try it goes FAILED instead.
-- ?2 lease in ms, ?3 relay id, ?4 claim token, ?5 the stale ones among the picked ids (JSON array),
-- ?6 a stale event's last_error ({relay} for the relay that held it: store::LEASE_EXPIRED).
-- Columns by name, as every store's claim returns them (see store/row.rs).
UPDATE outbox_events
SET status       = CASE WHEN status = 'PROCESSING' AND retry_count + 1 >= max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = retry_count + (status = 'PROCESSING'),
    last_error   = CASE WHEN status = 'PROCESSING'
                        THEN replace(?6, '{relay}', coalesce(locked_by, '?'))
                        ELSE last_error END,
    locked_until = CASE WHEN status = 'PROCESSING' AND retry_count + 1 >= max_retries THEN NULL
                        ELSE strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('%+.3f seconds', ?2 / 1000.0)) END,
    locked_by    = ?3,
    claim_token  = ?4,
    updated_at   = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
WHERE id IN (SELECT value FROM json_each(?1))
RETURNING id, id IN (SELECT value FROM json_each(?5)) AS stale, status = 'FAILED' AS exhausted,
          event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,
          event_class, schema_version, retry_count, max_retries, created_at, last_error
