-- Per-aggregate ordering (G6, docs/guarantees.md): events of an ordered aggregate type are
-- published one aggregate at a time, in commit order.
--
-- An event of an ordered aggregate is claimable when every earlier event of its aggregate still
-- in the table is done (PROCESSED), skipped by an operator, or taken by the same claim — and when
-- its id is at or below the relay's commit horizon: every transaction that could still commit an
-- earlier id has ended (postbox_horizon below), so a transaction that took id 10 and commits
-- after the one that took id 11 is never overtaken.

-- An operator's skip of a FAILED head (`postbox events skip`): the event stays FAILED, but no
-- longer holds back the later events of its aggregate. A retry clears it.
ALTER TABLE {schema}.outbox_events ADD COLUMN skipped_at TIMESTAMPTZ;

-- The unfinished events of each aggregate, in id order: the claim's "is an earlier event of this
-- aggregate unfinished?" reads the first entries of one aggregate, whatever the history holds.
CREATE INDEX outbox_events_aggregate_idx
    ON {schema}.outbox_events (aggregate_type, aggregate_id, id)
    WHERE status IN ('PENDING', 'PROCESSING', 'FAILED') AND skipped_at IS NULL
      AND aggregate_id IS NOT NULL;

-- Whether `aggregate_type` is one of `ordered` ('*' for all).
CREATE FUNCTION {schema}.postbox_is_ordered(aggregate_type text, aggregate_id text,
                                            ordered text[])
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $ordered$
SELECT aggregate_id IS NOT NULL AND aggregate_type IS NOT NULL
       AND cardinality(ordered) > 0
       AND (aggregate_type = ANY(ordered) OR '*' = ANY(ordered))
$ordered$;

-- The claim (see 0004_bounded_reads.sql for the planner settings) of a relay with ordered
-- aggregate types; without, relays call the four-argument postbox_claim, unchanged:
-- $5 the ordered aggregate types ('*' for all, empty for none), $6 the commit horizon (ordered
-- events above it wait). The walk skips ordered events whose aggregate has an earlier event that
-- cannot be claimed now (FAILED and not skipped, in flight, backing off, above the horizon), so
-- a parked aggregate does not fill the batch; of the rows the walk locked, an ordered event is
-- kept only if every earlier unfinished event of its aggregate is kept too (as many as the table
-- holds) — one another relay holds, or a stale one that goes FAILED on this take-over, holds it
-- back.
CREATE FUNCTION {schema}.postbox_claim(integer, double precision, text, uuid, text[], bigint)
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
WITH walked AS MATERIALIZED (
    SELECT e.id, e.status = 'PROCESSING' AS stale,
           e.status = 'PROCESSING' AND e.retry_count + 1 >= e.max_retries AS exhausting,
           {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5) AS ordered,
           e.aggregate_type, e.aggregate_id
    FROM {schema}.outbox_events e
    WHERE e.status IN ('PENDING', 'PROCESSING')
      AND (e.locked_until IS NULL OR e.locked_until < now())
      AND (NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $5)
           OR (e.id <= $6
               AND NOT EXISTS (
                   SELECT 1 FROM {schema}.outbox_events b
                   WHERE b.aggregate_type = e.aggregate_type
                     AND b.aggregate_id = e.aggregate_id
                     AND b.id < e.id
                     AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                     AND b.skipped_at IS NULL
                     AND NOT (b.status IN ('PENDING', 'PROCESSING')
                              AND (b.locked_until IS NULL OR b.locked_until < now())))))
    ORDER BY e.id
    LIMIT $1
    FOR UPDATE OF e SKIP LOCKED
), counted AS (
    -- Per walked row, how many earlier rows of its aggregate this claim takes (and keeps
    -- PROCESSING): a sort of the batch, not a scan of it per row.
    SELECT w.*, count(*) FILTER (WHERE NOT w.exhausting) OVER (
               PARTITION BY w.aggregate_type, w.aggregate_id ORDER BY w.id
               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS taken_before
    FROM walked w
), picked AS (
    SELECT c.id, c.stale
    FROM counted c
    WHERE NOT c.ordered
       OR c.taken_before = (
           SELECT count(*) FROM {schema}.outbox_events b
           WHERE b.aggregate_type = c.aggregate_type
             AND b.aggregate_id = c.aggregate_id
             AND b.id < c.id
             AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
             AND b.skipped_at IS NULL)
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

-- The commit horizon of the table: the id at or below which every event is committed or rolled
-- back for good. A probe reads the last id the table's sequence handed out, then which
-- transactions hold a writer's lock on the table (an INSERT takes it before it draws an id, and
-- keeps it until commit or rollback); once none of those is left, every id of the probe is
-- settled. Exact for every producer that draws ids by inserting (the Rust Outbox, the SQL API,
-- plain INSERT, COPY), and only writers of this table delay it — a long transaction elsewhere
-- does not.
--
-- Called with the previous probe (NULLs at first): returns `settled` (the probe's last id) when
-- its writers are gone, else NULL and the probe to keep; a new probe is taken when there is none.
CREATE FUNCTION {schema}.postbox_horizon(INOUT probe_last bigint, INOUT probe_writers text[],
                                         OUT settled bigint)
LANGUAGE plpgsql
VOLATILE
SET jit = off
AS $horizon$
BEGIN
    IF probe_last IS NULL THEN
        -- The sequence first, the locks after: a writer that drew an id up to probe_last held
        -- its lock before it did.
        probe_last := coalesce(pg_sequence_last_value(
            pg_get_serial_sequence('{schema}.outbox_events', 'id')::regclass), 0);
        probe_writers := ARRAY(
            SELECT l.virtualtransaction FROM pg_locks l
            WHERE l.locktype = 'relation'
              AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND l.relation = '{schema}.outbox_events'::regclass
              AND l.mode = 'RowExclusiveLock'
              AND l.granted);
    END IF;
    IF NOT EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'relation'
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.relation = '{schema}.outbox_events'::regclass
          AND l.mode = 'RowExclusiveLock'
          AND l.virtualtransaction = ANY(probe_writers))
    THEN
        settled := probe_last;
        probe_last := NULL;
        probe_writers := NULL;
    END IF;
END
$horizon$;

-- What a draining relay still has to wait for (see 0004_bounded_reads.sql), with ordering: an
-- ordered event held back by a FAILED (parked) or in-flight earlier event of its aggregate is not
-- claimable; only events that will come due by themselves (a lease, a backoff) are waited for.
-- NULL when nothing else is outstanding: a parked aggregate's events wait for an operator.
CREATE FUNCTION {schema}.postbox_backlog(ordered text[])
RETURNS double precision
LANGUAGE sql
STABLE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $backlog$
SELECT CASE
    WHEN EXISTS (
        SELECT 1 FROM {schema}.outbox_events e
        WHERE e.status IN ('PENDING', 'PROCESSING')
          AND (e.locked_until IS NULL OR e.locked_until < now())
          AND (NOT {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, ordered)
               OR NOT EXISTS (
                   SELECT 1 FROM {schema}.outbox_events b
                   WHERE b.aggregate_type = e.aggregate_type
                     AND b.aggregate_id = e.aggregate_id
                     AND b.id < e.id
                     AND b.status IN ('PENDING', 'PROCESSING', 'FAILED')
                     AND b.skipped_at IS NULL)))
    THEN 0.0::float8
    ELSE (SELECT EXTRACT(EPOCH FROM min(locked_until) - now())::float8
          FROM {schema}.outbox_events
          WHERE status IN ('PENDING', 'PROCESSING') AND locked_until >= now())
END
$backlog$;
