-- The highest id the outbox's sequence ever handed out, kept apart from the table: an event's
-- dedup id (its idempotency key, else its id) must never be handed out twice for the life of
-- the outbox, or an inbox drops the new event as a repeat of the old one — a loss with no
-- error. `TRUNCATE … RESTART IDENTITY` is undone for the sequence by the outbox's truncate
-- triggers (functions/postbox_id_truncate.sql, which records here what the sequence had handed
-- out), and a sequence set back below this mark any other way (setval, ALTER SEQUENCE
-- RESTART) is refused by postbox_id_sequence(), naming the fix. Archiving and retention record
-- the mark before they delete.
CREATE TABLE {schema}.postbox_id_high (
    only_row BOOLEAN PRIMARY KEY DEFAULT true CHECK (only_row),
    high BIGINT NOT NULL
);

INSERT INTO {schema}.postbox_id_high (high)
SELECT greatest(
    coalesce(pg_sequence_last_value(pg_get_serial_sequence('{schema}.outbox_events', 'id')), 0),
    coalesce((SELECT max(id) FROM {schema}.outbox_events), 0)
);
