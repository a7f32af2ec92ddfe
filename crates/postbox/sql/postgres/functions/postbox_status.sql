-- `postbox status`: counts that read only the events not yet done and the FAILED ones (through
-- their partial indexes), never the processed history. PROCESSED is counted exactly while the
-- table's own row estimate says at most $1 rows are processed, and estimated above that
-- (processed_exact tells which).
CREATE OR REPLACE FUNCTION {schema}.postbox_status(exact_below bigint)
RETURNS TABLE (
    pending bigint, processing bigint, processed bigint, processed_exact boolean, failed bigint,
    oldest_pending_age double precision
)
LANGUAGE plpgsql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $status$
DECLARE
    rows_estimate bigint;
BEGIN
    SELECT count(*) FILTER (WHERE e.status = 'PENDING'),
           count(*) FILTER (WHERE e.status = 'PROCESSING'),
           EXTRACT(EPOCH FROM now() - min(e.created_at))::float8
      INTO pending, processing, oldest_pending_age
      FROM {schema}.outbox_events e
     WHERE e.status IN ('PENDING', 'PROCESSING');
    SELECT count(*) INTO failed FROM {schema}.outbox_events e WHERE e.status = 'FAILED';
    -- Rows in the table as the planner estimates them: the density the last VACUUM or ANALYZE
    -- found, times the table's size now; before either ran, the statistics' live-row count.
    SELECT CASE WHEN c.relpages > 0 AND c.reltuples >= 0
                THEN (c.reltuples / c.relpages
                      * (pg_relation_size(c.oid) / current_setting('block_size')::bigint))::bigint
                ELSE pg_stat_get_live_tuples(c.oid) END
      INTO rows_estimate
      FROM pg_class c
     WHERE c.oid = '{schema}.outbox_events'::regclass;
    processed := greatest(0, coalesce(rows_estimate, 0) - pending - processing - failed);
    processed_exact := processed <= exact_below;
    IF processed_exact THEN
        SELECT count(*) INTO processed FROM {schema}.outbox_events e WHERE e.status = 'PROCESSED';
    END IF;
    RETURN NEXT;
END
$status$;
