-- Up to $2 FAILED events whose last try is more than $1 seconds old are deleted (an operator's
-- purge; relays never delete FAILED events). Reads the FAILED index, not the history.
WITH doomed AS (
    SELECT id FROM {schema}.outbox_events
    WHERE status = 'FAILED' AND updated_at < now() - $1::float8 * interval '1 second'
    ORDER BY id
    LIMIT $2
)
DELETE FROM {schema}.outbox_events e
USING doomed d
WHERE e.id = d.id AND e.status = 'FAILED'
