-- Up to $2 inbox rows received more than $1 seconds ago are deleted, oldest first: the dedup
-- window has passed for them (a repeat arriving later is handled again).
WITH doomed AS (
    SELECT consumer, message_id FROM {schema}.inbox_messages
    WHERE received_at < now() - $1::float8 * interval '1 second'
    ORDER BY received_at
    LIMIT $2
)
DELETE FROM {schema}.inbox_messages m
USING doomed d
WHERE m.consumer = d.consumer AND m.message_id = d.message_id
