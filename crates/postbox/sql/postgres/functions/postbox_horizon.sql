-- The commit horizon: the highest id below which no transaction can still commit an event
-- (`settled`). A probe (`probe_last`, `probe_writers`: the sequence's last value and the
-- transactions writing to the table when it was taken) settles once every writer it saw has
-- ended; the caller keeps the probe and passes it back. Writers are matched by virtual
-- transaction, and a prepared (two-phase) transaction by `-1/<xid>`, also after a server
-- restart. The sequence is read through postbox_id_sequence, which refuses one whose ids would
-- not follow commit order.

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
        -- No writer: settled at once. The check below would say so too, at the cost of a
        -- second read of the server's whole lock table (pg_locks takes every lock partition;
        -- most probes find no writer).
        IF cardinality(probe_writers) = 0 THEN
            settled := probe_last;
            probe_last := NULL;
            probe_writers := NULL;
            RETURN;
        END IF;
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
