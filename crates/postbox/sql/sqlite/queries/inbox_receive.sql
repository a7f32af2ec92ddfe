-- Whether consumer ?1 is to handle message ?2 (see the PostgreSQL function
-- postbox_inbox_receive): `duplicates` comes back 0 the first time, above 0 for a repeat.
INSERT INTO inbox_messages (consumer, message_id) VALUES (?1, ?2)
ON CONFLICT (consumer, message_id) DO UPDATE SET duplicates = duplicates + 1
RETURNING duplicates
