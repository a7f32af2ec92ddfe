-- Up to ?2 inbox rows received more than ?1 seconds ago are deleted, oldest first.
DELETE FROM inbox_messages
WHERE (consumer, message_id) IN (
    SELECT consumer, message_id FROM inbox_messages
    WHERE received_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', ?1))
    ORDER BY received_at
    LIMIT ?2
)
