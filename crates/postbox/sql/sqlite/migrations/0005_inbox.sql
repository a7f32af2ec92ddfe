-- The inbox, the consumers' end of the wire (see the PostgreSQL migration 0013_inbox.sql): one
-- row per message a consumer has handled, written in the consumer's own transaction. Times are
-- UTC text in the outbox's format.
CREATE TABLE inbox_messages (
    consumer    TEXT    NOT NULL CHECK (length(consumer) BETWEEN 1 AND 100),
    message_id  TEXT    NOT NULL CHECK (length(message_id) BETWEEN 1 AND 255),
    received_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    duplicates  INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id)
) WITHOUT ROWID;

CREATE INDEX inbox_messages_received_idx ON inbox_messages (received_at);

CREATE INDEX inbox_messages_duplicates_idx ON inbox_messages (consumer) WHERE duplicates > 0;
