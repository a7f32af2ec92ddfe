-- Records in postbox_id_high (migration 0019_id_high_water) the highest id the outbox's id
-- sequence handed out so far, and returns the mark: before a TRUNCATE (postbox_id_truncate) and
-- before archiving moves rows out (postbox_archive), so that a sequence set back below it is
-- found (postbox_id_sequence) even once the table is empty.
CREATE OR REPLACE FUNCTION {schema}.postbox_id_mark()
RETURNS bigint
LANGUAGE sql
VOLATILE
AS $mark$
    UPDATE {schema}.postbox_id_high
    SET high = greatest(high, coalesce(pg_sequence_last_value(
        pg_get_serial_sequence('{schema}.outbox_events', 'id')), 0))
    RETURNING high
$mark$;
