-- Events whose destination was down: back to PENDING after a delay, without spending a try (the
-- outage is not the event's fault). $1 ids, $2 reasons, $3 delays in ms, $4 claim token.
UPDATE {schema}.outbox_events AS e
SET status       = 'PENDING',
    locked_until = now() + r.delay_ms * interval '1 millisecond',
    last_error   = r.error,
    updated_at   = now()
FROM unnest($1::bigint[], $2::text[], $3::float8[]) AS r(id, error, delay_ms)
WHERE e.id = r.id AND e.claim_token = $4 AND e.status = 'PROCESSING'
