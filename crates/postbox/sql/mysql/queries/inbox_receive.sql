-- Whether consumer ? is to handle message ? (see the PostgreSQL function postbox_inbox_receive):
-- one row affected the first time (written), two for a repeat (its duplicates counted).
INSERT INTO inbox_messages (consumer, message_id) VALUES (?, ?)
ON DUPLICATE KEY UPDATE duplicates = duplicates + 1
