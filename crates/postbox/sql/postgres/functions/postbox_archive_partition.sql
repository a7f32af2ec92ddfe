-- The archive's partition for the week (Monday 00:00 UTC) that holds `at`, created if missing.
-- Rows of that week that went to the DEFAULT partition meanwhile are moved into it.
CREATE OR REPLACE FUNCTION {schema}.postbox_archive_partition(at timestamptz)
RETURNS void
LANGUAGE plpgsql
AS $partition$
DECLARE
    week_start timestamptz := date_trunc('week', at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    week_end   timestamptz := week_start + interval '7 days';
    part       text := 'outbox_events_archive_p'
                       || to_char(week_start AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    IF to_regclass('{schema}.' || quote_ident(part)) IS NOT NULL THEN
        RETURN;
    END IF;
    CREATE TEMP TABLE postbox_archive_strays ON COMMIT DROP AS
        WITH strays AS (
            DELETE FROM {schema}.outbox_events_archive_default
            WHERE archived_at >= week_start AND archived_at < week_end
            RETURNING *
        )
        SELECT * FROM strays;
    EXECUTE format(
        'CREATE TABLE {schema}.%I PARTITION OF {schema}.outbox_events_archive '
        'FOR VALUES FROM (%L) TO (%L)',
        part, week_start, week_end);
    INSERT INTO {schema}.outbox_events_archive SELECT * FROM postbox_archive_strays;
    DROP TABLE postbox_archive_strays;
END
$partition$;
