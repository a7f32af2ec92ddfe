-- Of the events a polling claim beside the slot just took ($1, under claim token $2), those of
-- an ordered aggregate type ($3) whose aggregate has another event in flight (PROCESSING under
-- another claim) or FAILED and not skipped, whatever its id: put back as they were before the
-- claim, no try spent. The polling claim holds an aggregate's events in id order, and the slot
-- in commit order: with producers committing out of id order, the poll would otherwise take an
-- event with a lower id while a later one of its aggregate is being published.
WITH back AS (
    SELECT e.id
    FROM {schema}.outbox_events e
    WHERE e.id = ANY($1::bigint[])
      AND e.claim_token = $2::uuid
      AND e.status = 'PROCESSING'
      AND {schema}.postbox_is_ordered(e.aggregate_type, e.aggregate_id, $3::text[])
      AND EXISTS (
          SELECT 1 FROM {schema}.outbox_events b
          WHERE b.aggregate_type = e.aggregate_type
            AND b.aggregate_id = e.aggregate_id
            AND b.id <> e.id
            AND b.status IN ('PROCESSING', 'FAILED')
            AND b.skipped_at IS NULL
            AND b.aggregate_id IS NOT NULL
            AND b.claim_token IS DISTINCT FROM $2::uuid)
)
UPDATE {schema}.outbox_events AS e
SET status       = 'PENDING',
    locked_until = NULL,
    locked_by    = NULL,
    claim_token  = NULL
FROM back
WHERE e.id = back.id
RETURNING e.id
