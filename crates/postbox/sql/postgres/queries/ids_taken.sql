-- Of the delivered ids $1 a claim by id did not get, those another claim took or that are
-- finished: nothing to look at again. (A row not visible yet is not returned, nor one still
-- PENDING: both are looked at again.)
SELECT e.id FROM {schema}.outbox_events e
WHERE e.id = ANY($1::bigint[]) AND (e.status <> 'PENDING' OR e.last_error IS NOT NULL)
