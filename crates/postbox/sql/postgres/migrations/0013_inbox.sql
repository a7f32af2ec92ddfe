-- The inbox, the consumers' end of the wire: one row per message a consumer has handled,
-- written in the consumer's own transaction together with what handling the message changed. A
-- repeat of the message (a redelivery, a replay with the original dedup id, a copy published
-- again after a relay took over an expired lease) finds the row and is skipped; a transaction
-- that rolls back (a crash before its commit) leaves no row, so the message is handled when it
-- comes again. Rows are kept for the dedup window and then purged (PurgeKind::Inbox).
-- A new table and a function: nothing here locks or rewrites outbox_events, so the migration is
-- safe while producers and relays run.
CREATE TABLE {schema}.inbox_messages (
    consumer    VARCHAR(100) NOT NULL,
    message_id  VARCHAR(255) NOT NULL,
    received_at TIMESTAMPTZ  NOT NULL DEFAULT now(),
    -- Repeats skipped (counted by the transactions that skipped them and committed).
    duplicates  INTEGER      NOT NULL DEFAULT 0,
    PRIMARY KEY (consumer, message_id)
);

-- The purge reads the oldest rows first.
CREATE INDEX inbox_messages_received_idx ON {schema}.inbox_messages (received_at);

-- The rows that were repeated: the status report sums their duplicates without reading the
-- whole inbox.
CREATE INDEX inbox_messages_duplicates_idx ON {schema}.inbox_messages (consumer)
    WHERE duplicates > 0;

-- Whether `consumer` is to handle the message `message_id`: true the first time (the row is
-- written, and commits or rolls back with the caller's transaction), false for a repeat (its
-- count of duplicates goes up). Call it inside the transaction that applies the message's
-- effect. A concurrent first delivery of the same message waits here until the other
-- transaction ends: it answers false if that one committed, true if it rolled back.
CREATE FUNCTION {schema}.postbox_inbox_receive(consumer text, message_id text)
RETURNS boolean
LANGUAGE plpgsql
VOLATILE
AS $receive$
#variable_conflict use_column
DECLARE
    seen integer;
BEGIN
    IF postbox_inbox_receive.consumer IS NULL OR postbox_inbox_receive.consumer = ''
       OR length(postbox_inbox_receive.consumer) > 100 THEN
        RAISE EXCEPTION 'postbox_inbox_receive: consumer must be 1 to 100 characters, got %',
            coalesce(length(postbox_inbox_receive.consumer)::text || ' characters', 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'name the consumer (e.g. the service and handler), the same on every instance';
    END IF;
    IF postbox_inbox_receive.message_id IS NULL OR postbox_inbox_receive.message_id = ''
       OR length(postbox_inbox_receive.message_id) > 255 THEN
        RAISE EXCEPTION 'postbox_inbox_receive: message_id must be 1 to 255 characters, got %',
            coalesce(length(postbox_inbox_receive.message_id)::text || ' characters', 'NULL')
            USING ERRCODE = '22023',
                  HINT = 'pass the message''s dedup id (the postbox-dedup-id header, Nats-Msg-Id, the AMQP message-id, Idempotency-Key or the CloudEvents id)';
    END IF;
    INSERT INTO {schema}.inbox_messages AS m (consumer, message_id)
    VALUES (postbox_inbox_receive.consumer, postbox_inbox_receive.message_id)
    ON CONFLICT (consumer, message_id) DO UPDATE SET duplicates = m.duplicates + 1
    RETURNING m.duplicates INTO seen;
    RETURN seen = 0;
END
$receive$;
