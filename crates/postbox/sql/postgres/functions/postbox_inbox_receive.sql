-- Whether `consumer` is to handle the message `message_id`: true the first time (the row is
-- written, and commits or rolls back with the caller's transaction), false for a repeat (its
-- count of duplicates goes up). Call it inside the transaction that applies the message's
-- effect. A concurrent first delivery of the same message waits here until the other
-- transaction ends: it answers false if that one committed, true if it rolled back.
CREATE OR REPLACE FUNCTION {schema}.postbox_inbox_receive(consumer text, message_id text)
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
