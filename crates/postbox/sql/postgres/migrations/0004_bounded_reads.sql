-- Every read on the relay's and the CLI's hot paths costs what the work in hand costs, never what
-- the table's history costs, with or without statistics.
--
-- The claim: PostgreSQL plans a SQL function's statements without knowing the batch size, so it
-- takes the LIMIT for a tenth of the due rows its statistics count. Statistics taken while a large
-- backlog was pending (an ANALYZE by a DBA, `vacuumdb -z`) make that tens of thousands of rows,
-- and the join back to the table became a merge join that walked the primary key from the first
-- id: every processed event still in the table, at every claim. Merge and hash joins are turned
-- off for the function alone; what is left is a nested loop that fetches each picked row by its
-- primary key, so a claim of 100 reads about 100 rows whatever the table holds. The same
-- estimate put the plan's cost past jit_above_cost, and compiling it took longer than the claim
-- itself (5-7 ms a claim, a drain four times slower), so JIT is off for it too.
CREATE OR REPLACE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid)
RETURNS TABLE (
    id bigint, stale boolean, exhausted boolean, event_type text, aggregate_type text,
    aggregate_id text, idempotency_key text, payload text, headers jsonb, event_class text,
    schema_version integer, retry_count integer, max_retries integer, created_at timestamptz,
    last_error text
)
LANGUAGE sql
VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_mergejoin = off
SET enable_hashjoin = off
SET jit = off
AS $claim$
WITH picked AS (
    SELECT id, status = 'PROCESSING' AS stale
    FROM {schema}.outbox_events
    WHERE status IN ('PENDING', 'PROCESSING')
      AND (locked_until IS NULL OR locked_until < now())
    ORDER BY id
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE {schema}.outbox_events AS e
SET status       = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = e.retry_count + CASE WHEN p.stale THEN 1 ELSE 0 END,
    last_error   = CASE WHEN p.stale
                        THEN 'lease expired: relay ' || coalesce(e.locked_by, '?')
                             || ' did not finish publishing in time (crashed or stalled)'
                        ELSE e.last_error END,
    locked_until = CASE WHEN p.stale AND e.retry_count + 1 >= e.max_retries THEN NULL
                        ELSE now() + $2::float8 * interval '1 millisecond' END,
    locked_by    = $3,
    claim_token  = $4,
    updated_at   = now()
FROM picked p
WHERE e.id = p.id
RETURNING e.id, p.stale, e.status = 'FAILED', e.event_type::text, e.aggregate_type::text,
          e.aggregate_id::text, e.idempotency_key::text, e.payload::text, e.headers,
          e.event_class::text, e.schema_version, e.retry_count, e.max_retries, e.created_at,
          e.last_error
$claim$;

-- What a draining relay still has to wait for: 0 when an event can be claimed now, else the
-- seconds until the earliest lease or backoff runs out, NULL when nothing is outstanding. The
-- first probe walks the polling index from the head of the queue and stops at the first
-- claimable event (past the batches other relays hold); the minimum over every outstanding event
-- is taken only when none is claimable, when all of them are in flight or waiting for a retry.
-- Sequential and bitmap scans are off so that statistics saying "most rows are due" cannot turn
-- the probe into a scan of the whole table from its oldest, processed, rows.
CREATE OR REPLACE FUNCTION {schema}.postbox_backlog()
RETURNS double precision
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $backlog$
SELECT CASE
    WHEN EXISTS (SELECT 1 FROM {schema}.outbox_events
                 WHERE status IN ('PENDING', 'PROCESSING')
                   AND (locked_until IS NULL OR locked_until < now()))
    THEN 0.0::float8
    -- NULL when nothing is outstanding (greatest() would turn it into 0).
    ELSE (SELECT EXTRACT(EPOCH FROM min(locked_until) - now())::float8
          FROM {schema}.outbox_events
          WHERE status IN ('PENDING', 'PROCESSING'))
END
$backlog$;

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
