-- Purges archived events archived before `cutoff_at`: every weekly partition wholly before it
-- is dropped (in a dry run, counted), then up to `batch_size` rows of what is left (the week the
-- cutoff falls in, and the DEFAULT partition) are deleted. Returns how many rows went (or would go);
-- call again until it returns fewer than `batch_size` rows deleted from the rest.
CREATE OR REPLACE FUNCTION {schema}.postbox_archive_purge(cutoff_at timestamptz, batch_size integer, dry_run boolean,
                                               OUT purged bigint, OUT rest bigint)
LANGUAGE plpgsql
SET jit = off
AS $purge$
DECLARE
    part record;
    n bigint;
BEGIN
    purged := 0;
    FOR part IN
        SELECT c.relname
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = '{schema}.outbox_events_archive'::regclass
          AND c.relname ~ '^outbox_events_archive_p[0-9]{8}$'
          AND (to_timestamp(right(c.relname, 8), 'YYYYMMDD')::timestamp AT TIME ZONE 'UTC')
              + interval '7 days' <= cutoff_at
        ORDER BY c.relname
    LOOP
        EXECUTE format('SELECT count(*) FROM {schema}.%I', part.relname) INTO n;
        purged := purged + n;
        IF NOT dry_run THEN
            EXECUTE format('DROP TABLE {schema}.%I', part.relname);
        END IF;
    END LOOP;
    IF dry_run THEN
        SELECT count(*) INTO rest FROM {schema}.outbox_events_archive WHERE archived_at < cutoff_at;
        rest := rest - purged;
    ELSE
        WITH doomed AS (
            SELECT id, archived_at FROM {schema}.outbox_events_archive
            WHERE archived_at < cutoff_at
            LIMIT batch_size
        ), gone AS (
            DELETE FROM {schema}.outbox_events_archive a
            USING doomed d
            WHERE a.id = d.id AND a.archived_at = d.archived_at
            RETURNING 1
        )
        SELECT count(*) INTO rest FROM gone;
    END IF;
    purged := purged + rest;
END
$purge$;
