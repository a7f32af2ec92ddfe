-- $1 ids, $2 claim token, $3 lease in ms
UPDATE {schema}.outbox_events
SET locked_until = now() + $3::float8 * interval '1 millisecond', updated_at = now()
WHERE id = ANY($1) AND claim_token = $2 AND status = 'PROCESSING'
