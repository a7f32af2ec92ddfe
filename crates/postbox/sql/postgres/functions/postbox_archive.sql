-- One batch of archiving. Walks the table in id order from `after_id`, up to `batch_size` rows,
-- and stops at the first row created at or after `cutoff_at` (ids follow creation, so the rest
-- are younger); of the rows walked, the PROCESSED ones move to the archive (PENDING, PROCESSING
-- and FAILED rows stay where they are). Returns the last id walked (the `after_id` of the next
-- batch), how many rows moved, and whether the walk is over. Bounded by `batch_size` whatever the
-- table holds: the walk reads the primary key from `after_id`, and each row it moves once.
-- Records the id sequence's mark first (functions/postbox_id_truncate.sql).
CREATE OR REPLACE FUNCTION {schema}.postbox_archive(cutoff_at timestamptz, after_id bigint, batch_size integer,
                                         OUT last_id bigint, OUT moved bigint, OUT done boolean)
LANGUAGE plpgsql
SET jit = off
AS $archive$
BEGIN
    PERFORM {schema}.postbox_archive_partition(now());
    -- What the id sequence handed out, before rows leave the table (postbox_id_high).
    PERFORM {schema}.postbox_id_mark();
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
