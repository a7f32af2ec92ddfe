-- The outbox's truncate triggers (migration 0019_id_high_water): before a TRUNCATE of
-- outbox_events, what its id sequence handed out is recorded in postbox_id_high; after it, a
-- sequence that RESTART IDENTITY set back is set to that mark again, in the same transaction,
-- so new events never take the id (the dedup id) of an event already relayed.
CREATE OR REPLACE FUNCTION {schema}.postbox_id_truncate()
RETURNS trigger
LANGUAGE plpgsql
AS $truncate$
DECLARE
    seq regclass := pg_get_serial_sequence('{schema}.outbox_events', 'id')::regclass;
    high bigint;
BEGIN
    IF TG_WHEN = 'BEFORE' THEN
        PERFORM {schema}.postbox_id_mark();
    ELSE
        SELECT h.high INTO high FROM {schema}.postbox_id_high h;
        IF high > 0 AND coalesce(pg_sequence_last_value(seq), 0) < high THEN
            PERFORM setval(seq, high);
        END IF;
    END IF;
    RETURN NULL;
END
$truncate$;

-- A trigger needs its function, and functions are installed after the migrations: the
-- triggers are (re)made here, with the function they call.
DROP TRIGGER IF EXISTS postbox_id_before_truncate ON {schema}.outbox_events;
CREATE TRIGGER postbox_id_before_truncate BEFORE TRUNCATE ON {schema}.outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.postbox_id_truncate();
DROP TRIGGER IF EXISTS postbox_id_after_truncate ON {schema}.outbox_events;
CREATE TRIGGER postbox_id_after_truncate AFTER TRUNCATE ON {schema}.outbox_events
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.postbox_id_truncate();
