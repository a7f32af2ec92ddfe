-- Retention (docs/retention.md). PROCESSED events created more than `retention` ago move from
-- outbox_events to outbox_events_archive in short batches; archived events are purged after
-- `archive_retention`; FAILED events stay until an operator retries or purges them.
--
-- The archive is partitioned by the week (UTC) of archiving, so that purging a week drops a table
-- instead of deleting its rows one by one (each delete leaves a dead row to vacuum, and a week at
-- 1,000 events/s holds 600M rows). Rows outside every weekly partition land in the DEFAULT one.

ALTER TABLE {schema}.outbox_events_archive RENAME TO outbox_events_archive_unpartitioned;
ALTER INDEX {schema}.outbox_events_archive_pkey RENAME TO outbox_events_archive_unpartitioned_pkey;

CREATE TABLE {schema}.outbox_events_archive (
    LIKE {schema}.outbox_events INCLUDING DEFAULTS,
    archived_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (id, archived_at)
) PARTITION BY RANGE (archived_at);

CREATE TABLE {schema}.outbox_events_archive_default
    PARTITION OF {schema}.outbox_events_archive DEFAULT;

-- Purging the part of a week that is past the cutoff_at finds its rows by archiving time.
CREATE INDEX outbox_events_archive_archived_at_idx
    ON {schema}.outbox_events_archive (archived_at);

-- The archive's partition for the week (Monday 00:00 UTC) that holds `at`, created if missing.
-- Rows of that week that went to the DEFAULT partition meanwhile are moved into it.
CREATE FUNCTION {schema}.postbox_archive_partition(at timestamptz)
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

-- One batch of archiving. Walks the table in id order from `after_id`, up to `batch_size` rows,
-- and stops at the first row created at or after `cutoff_at` (ids follow creation, so the rest
-- are younger); of the rows walked, the PROCESSED ones move to the archive (PENDING, PROCESSING
-- and FAILED rows stay where they are). Returns the last id walked (the `after_id` of the next
-- batch), how many rows moved, and whether the walk is over. Bounded by `batch_size` whatever the
-- table holds: the walk reads the primary key from `after_id`, and each row it moves once.
CREATE FUNCTION {schema}.postbox_archive(cutoff_at timestamptz, after_id bigint, batch_size integer,
                                         OUT last_id bigint, OUT moved bigint, OUT done boolean)
LANGUAGE plpgsql
SET jit = off
AS $archive$
BEGIN
    PERFORM {schema}.postbox_archive_partition(now());
    WITH walk AS MATERIALIZED (
        SELECT e.id, e.created_at >= cutoff_at AS young
        FROM {schema}.outbox_events e
        WHERE e.id > after_id
        ORDER BY e.id
        LIMIT batch_size
    ), stop AS (
        SELECT min(id) AS id FROM walk WHERE young
    ), old AS (
        SELECT w.id FROM walk w, stop s WHERE s.id IS NULL OR w.id < s.id
    ), gone AS (
        DELETE FROM {schema}.outbox_events e
        USING old o
        WHERE e.id = o.id AND e.status = 'PROCESSED'
        RETURNING e.*
    ), kept AS (
        INSERT INTO {schema}.outbox_events_archive (
            id, status, event_type, aggregate_type, aggregate_id, payload, event_class,
            schema_version, headers, idempotency_key, retry_count, max_retries, last_error,
            processed_at, locked_until, locked_by, claim_token, created_at, updated_at,
            archived_at)
        SELECT id, status, event_type, aggregate_type, aggregate_id, payload, event_class,
            schema_version, headers, idempotency_key, retry_count, max_retries, last_error,
            processed_at, locked_until, locked_by, claim_token, created_at, updated_at,
            now()
        FROM gone
        RETURNING 1
    )
    SELECT coalesce((SELECT max(id) FROM old), after_id),
           (SELECT count(*) FROM kept),
           (SELECT id FROM stop) IS NOT NULL OR (SELECT count(*) FROM walk) < batch_size
    INTO last_id, moved, done;
END
$archive$;

-- How many PROCESSED events created before `cutoff_at` wait to be archived, for a dry run. Walks
-- the same rows as the archiving would (id order, stopping at the first young row), without
-- moving any; `batch_size` rows per call, as postbox_archive.
CREATE FUNCTION {schema}.postbox_archive_count(cutoff_at timestamptz, after_id bigint, batch_size integer,
                                               OUT last_id bigint, OUT moved bigint,
                                               OUT done boolean)
LANGUAGE sql
STABLE
SET jit = off
AS $count$
WITH walk AS MATERIALIZED (
    SELECT e.id, e.status, e.created_at >= cutoff_at AS young
    FROM {schema}.outbox_events e
    WHERE e.id > after_id
    ORDER BY e.id
    LIMIT batch_size
), stop AS (
    SELECT min(id) AS id FROM walk WHERE young
), old AS (
    SELECT w.* FROM walk w, stop s WHERE s.id IS NULL OR w.id < s.id
)
SELECT coalesce((SELECT max(id) FROM old), after_id),
       (SELECT count(*) FROM old WHERE status = 'PROCESSED'),
       (SELECT id FROM stop) IS NOT NULL OR (SELECT count(*) FROM walk) < batch_size
$count$;

-- Purges archived events archived before `cutoff_at`: every weekly partition wholly before it
-- is dropped (in a dry run, counted), then up to `batch_size` rows of what is left (the week the
-- cutoff falls in, and the DEFAULT partition) are deleted. Returns how many rows went (or would go);
-- call again until it returns fewer than `batch_size` rows deleted from the rest.
CREATE FUNCTION {schema}.postbox_archive_purge(cutoff_at timestamptz, batch_size integer, dry_run boolean,
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

-- The rows of the archive before partitioning, each in the partition of its week.
DO $move$
DECLARE
    week record;
BEGIN
    FOR week IN
        SELECT DISTINCT date_trunc('week', archived_at AT TIME ZONE 'UTC') AS start
        FROM {schema}.outbox_events_archive_unpartitioned
    LOOP
        PERFORM {schema}.postbox_archive_partition(week.start AT TIME ZONE 'UTC');
    END LOOP;
END
$move$;
INSERT INTO {schema}.outbox_events_archive (
    id, status, event_type, aggregate_type, aggregate_id, payload, event_class,
    schema_version, headers, idempotency_key, retry_count, max_retries, last_error,
    processed_at, locked_until, locked_by, claim_token, created_at, updated_at,
    archived_at)
SELECT id, status, event_type, aggregate_type, aggregate_id, payload, event_class,
    schema_version, headers, idempotency_key, retry_count, max_retries, last_error,
    processed_at, locked_until, locked_by, claim_token, created_at, updated_at,
    archived_at
FROM {schema}.outbox_events_archive_unpartitioned;
DROP TABLE {schema}.outbox_events_archive_unpartitioned;
