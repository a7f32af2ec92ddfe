-- Whether consumer $1 is to handle message $2 (functions/postbox_inbox_receive.sql): true the first time,
-- false for a repeat. Runs in the consumer's transaction.
SELECT {schema}.postbox_inbox_receive($1::text, $2::text)
