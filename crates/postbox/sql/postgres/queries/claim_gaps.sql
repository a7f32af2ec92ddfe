-- What a relay's claims passed over while a transaction held the commit horizon back (see
-- Store::claim_gaps): the rows now in the ranges of ids it passed while none was visible ($1,
-- $2: their first and last ids), each with whether it is still to do and whether a claim may
-- take it now; then the first $4 ids present after $3, through the primary key (none when $4
-- is 0). The ranges missing between those are in flight, rolled back or removed: the relay
-- keeps them, and its floor and cursor go on past them.
SELECT e.id, true AS passed,
       e.status IN ('PENDING', 'PROCESSING') AND e.last_error IS NULL AS unfinished,
       e.status IN ('PENDING', 'PROCESSING') AND e.last_error IS NULL
           AND (e.locked_until IS NULL OR e.locked_until < now()) AS claimable
FROM unnest($1::bigint[], $2::bigint[]) AS r(lo, hi)
CROSS JOIN LATERAL (
    SELECT e.id, e.status, e.last_error, e.locked_until
    FROM {schema}.outbox_events e
    WHERE e.id BETWEEN r.lo AND r.hi) e
UNION ALL
(SELECT e.id, false, false, false
 FROM {schema}.outbox_events e
 WHERE $4::integer > 0 AND e.id > $3::bigint
 ORDER BY e.id
 LIMIT $4::integer)
