-- The outbox's id sequence, checked (functions/postbox_id_sequence.sql): its last value, or an
-- error naming what to fix when ids from it would not follow commit order.
SELECT {schema}.postbox_id_sequence()
