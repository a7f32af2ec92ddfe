-- A dry run of inbox_purge.sql: how many inbox rows were received more than ?1 seconds ago.
SELECT count(*) FROM inbox_messages
WHERE received_at < strftime('%Y-%m-%dT%H:%M:%fZ', 'now', printf('-%f seconds', ?1))
