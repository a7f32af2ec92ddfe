-- The inbox, the consumers' end of the wire (see the PostgreSQL migration 0013_inbox.sql): one
-- row per message a consumer has handled, written in the consumer's own transaction. A new
-- table: nothing here locks outbox_events. Times are UTC, as in the outbox.
CREATE TABLE IF NOT EXISTS inbox_messages (
    consumer    VARCHAR(100) NOT NULL,
    message_id  VARCHAR(255) NOT NULL,
    received_at DATETIME(6)  NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    duplicates  INT          NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id),
    KEY inbox_messages_received_idx (received_at),
    KEY inbox_messages_duplicates_idx (duplicates, consumer)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin
