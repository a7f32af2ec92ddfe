-- The outbox's id sequence, checked: its last value (0 before its first use). Raises SQLSTATE
-- 55000 with a hint naming the fix when ids from it would not follow commit order, or 42501
-- when the role may not read it.
CREATE OR REPLACE FUNCTION {schema}.postbox_id_sequence()
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET jit = off
AS $seq$
DECLARE
    seq regclass := pg_get_serial_sequence('{schema}.outbox_events', 'id')::regclass;
    -- Named with its schema in every message, whatever the search_path.
    name text := (SELECT format('%I.%I', n.nspname, c.relname)
                  FROM pg_catalog.pg_class c
                  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
                  WHERE c.oid = seq);
    cache bigint;
    step bigint;
    last bigint;
    top bigint;
BEGIN
    SELECT s.seqcache, s.seqincrement INTO cache, step FROM pg_catalog.pg_sequence s
    WHERE s.seqrelid = seq;
    IF cache > 1 THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('the outbox''s id sequence %s has CACHE %s: each session draws ids '
                             'from a block of its own, so ids no longer follow commit order and '
                             'events could be published out of order or wait unseen', name, cache),
            HINT = format('ALTER SEQUENCE %s CACHE 1', name);
    END IF;
    IF step <> 1 THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('the outbox''s id sequence %s has INCREMENT %s: Postbox needs ids '
                             'that grow by 1', name, step),
            HINT = format('ALTER SEQUENCE %s INCREMENT BY 1', name);
    END IF;
    IF NOT has_sequence_privilege(seq, 'SELECT') AND NOT has_sequence_privilege(seq, 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('the database role %I may not read the outbox''s id sequence %s, '
                             'which the relay reads to know which ids are committed',
                             current_user, name),
            HINT = format('GRANT USAGE ON SEQUENCE %s TO %I', name, current_user);
    END IF;
    -- The table first, the sequence after: every id this read sees was drawn before the
    -- sequence is read, so only a sequence moved back is below it (read the other way round,
    -- ids drawn and committed in between would look like one).
    SELECT e.id INTO top FROM {schema}.outbox_events e ORDER BY e.id DESC LIMIT 1;
    last := coalesce(pg_sequence_last_value(seq), 0);
    IF top > last THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('the outbox''s id sequence %s was moved back: its last value %s is '
                             'below the highest id in the table, %s (setval, ALTER SEQUENCE '
                             'RESTART or TRUNCATE … RESTART IDENTITY), so new events would take '
                             'ids below ones already relayed', name, last, top),
            HINT = format('SELECT setval(%L, (SELECT max(id) FROM {schema}.outbox_events))',
                          name);
    END IF;
    -- Below every id ever handed out (the mark kept by TRUNCATE, archiving and retention), with
    -- the table emptied: new events would take the dedup ids of events already relayed.
    SELECT h.high INTO top FROM {schema}.postbox_id_high h;
    IF top > last THEN
        RAISE EXCEPTION USING ERRCODE = '55000',
            MESSAGE = format('the outbox''s id sequence %s was moved back: its last value %s is '
                             'below the highest id it ever handed out, %s (setval or ALTER '
                             'SEQUENCE RESTART after the table was emptied), so new events would '
                             'take the ids, and the dedup ids, of events already relayed, and '
                             'consumers would drop them as repeats', name, last, top),
            HINT = format('SELECT setval(%L, %s)', name, top);
    END IF;
    RETURN last;
END
$seq$;
