-- What every claim does with the rows it picked (`ids`; `stale_ids`, those of them whose lease
-- ran out): takes them under this claim's lease ($3 lease in milliseconds, $4 the relay, $5
-- the token), a stale one counted as a failed try ($6 its last_error, `{relay}` standing for the
-- relay that held it) and FAILED when that was its last, and returns them. By id: a join of the
-- picked rows to the table would be planned once for the session, and on a table whose
-- statistics say it is empty the planner may put the table outside and read all of it.
CREATE OR REPLACE FUNCTION {schema}.postbox_claim_take(bigint[], bigint[], double precision, text,
                                                       uuid, text)
RETURNS TABLE (
    id bigint, stale boolean, exhausted boolean, event_type text, aggregate_type text,
    aggregate_id text, idempotency_key text, payload text, headers jsonb, event_class text,
    schema_version integer, retry_count integer, max_retries integer, created_at timestamptz,
    last_error text
)
LANGUAGE plpgsql
VOLATILE
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $take$
#variable_conflict use_column
BEGIN
RETURN QUERY
UPDATE {schema}.outbox_events AS e
SET status       = CASE WHEN e.id = ANY($2) AND e.retry_count + 1 >= e.max_retries
                        THEN 'FAILED' ELSE 'PROCESSING' END,
    retry_count  = e.retry_count + CASE WHEN e.id = ANY($2) THEN 1 ELSE 0 END,
    last_error   = CASE WHEN e.id = ANY($2)
                        THEN replace($6, '{relay}', coalesce(e.locked_by, '?'))
                        ELSE e.last_error END,
    locked_until = CASE WHEN e.id = ANY($2) AND e.retry_count + 1 >= e.max_retries
                        THEN NULL
                        ELSE now() + $3::float8 * interval '1 millisecond' END,
    locked_by    = $4,
    claim_token  = $5,
    updated_at   = now()
WHERE e.id = ANY($1)
RETURNING e.id, e.id = ANY($2), e.status = 'FAILED', e.event_type::text,
          e.aggregate_type::text, e.aggregate_id::text, e.idempotency_key::text,
          e.payload::text, e.headers, e.event_class::text, e.schema_version, e.retry_count,
          e.max_retries, e.created_at, e.last_error;
END
$take$;
