-- The commit horizon (0007_ordering.sql) made safe for what a database that others use does.
--
-- 1. The id sequence must hand out ids in commit order within a session's reach: with CACHE > 1
--    each session draws ids from a block of its own, so one aggregate's events committed one
--    after another from two connections get ids 2, 21, 3, and pg_sequence_last_value reports the
--    end of a cached block while lower ids are still to be drawn. Refused, naming the fix.
-- 2. A sequence moved back (setval, ALTER SEQUENCE RESTART, TRUNCATE … RESTART IDENTITY) below
--    ids still in the table would hand out ids below ones already relayed: refused, naming the
--    fix. A relay whose table was emptied and restarted finds its floor again from 0.
-- 3. A role that may not read the sequence is told which grant it needs.
-- 4. A transaction that was writing when a probe was taken and then PREPAREs (two-phase commit)
--    holds its locks under the virtual transaction `-1/<xid>`, also after a server restart: the
--    probe waits for every prepared writer of the table too, rather than losing sight of it.

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
    RETURN last;
END
$seq$;

CREATE OR REPLACE FUNCTION {schema}.postbox_horizon(INOUT probe_last bigint,
                                                    INOUT probe_writers text[],
                                                    OUT settled bigint)
LANGUAGE plpgsql
VOLATILE
SET jit = off
AS $horizon$
BEGIN
    IF probe_last IS NULL THEN
        -- The sequence first, the locks after: a writer that drew an id up to probe_last held
        -- its lock before it did.
        probe_last := {schema}.postbox_id_sequence();
        probe_writers := ARRAY(
            SELECT l.virtualtransaction FROM pg_locks l
            WHERE l.locktype = 'relation'
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.relation = '{schema}.outbox_events'::regclass
              AND l.mode = 'RowExclusiveLock'
              AND l.granted);
    END IF;
    -- A writer of the probe that has since PREPAREd shows as `-1/<xid>`: while the probe waits
    -- for anyone, every prepared writer of the table counts as one of its writers.
    IF NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'relation'
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.relation = '{schema}.outbox_events'::regclass
          AND l.mode = 'RowExclusiveLock'
          AND (l.virtualtransaction = ANY(probe_writers)
               OR (cardinality(probe_writers) > 0 AND l.virtualtransaction LIKE '-1/%')))
    THEN
        settled := probe_last;
        probe_last := NULL;
        probe_writers := NULL;
    END IF;
END
$horizon$;
