-- What a relay's claims passed over while a transaction held the commit horizon back (see
-- Store::claim_gaps): the rows now in the ranges of ids it passed while none was visible ($1,
-- $2: their first and last ids), each with whether it is still to do and whether a claim may
-- take it now; then how far the first $4 ids present after $3 go (through the primary key;
-- none when $4 is 0): the last one, with how many were read (n); and, only when they are
-- fewer than the ids they span, each id that ends a gap with the id present before it (prev,
-- or $3). A gap before the first id read alone (the ids of a transaction held open since
-- before them, most often) is answered from the first read: the second lists gaps among them. The gaps are in flight, rolled back or removed: the relay keeps them, and its floor
-- and cursor go on past them. Answering the gaps, not every id present, keeps a read of
-- hundreds of thousands of ids to a few rows; and a read without a gap (most of them: a
-- history is dense) counts the ids, which costs a fraction of listing where the gaps are.
-- The read of the ids is written twice, not shared through a CTE of the ids: read by both, such
-- a CTE would be kept in memory, where the ids' order is lost and the gaps' window sorts them;
-- the second read runs only when the first found a gap.
WITH seen AS (
    SELECT count(*) AS n, min(p.id) AS first, max(p.id) AS last
    FROM (SELECT e.id
          FROM {schema}.outbox_events e
          WHERE $4::integer > 0 AND e.id > $3::bigint
          ORDER BY e.id
          LIMIT $4::integer) p)
SELECT e.id, true AS passed,
       e.status IN ('PENDING', 'PROCESSING') AND e.last_error IS NULL AS unfinished,
       e.status IN ('PENDING', 'PROCESSING') AND e.last_error IS NULL
           AND (e.locked_until IS NULL OR e.locked_until < now()) AS claimable,
       NULL::bigint AS prev, NULL::bigint AS n
FROM unnest($1::bigint[], $2::bigint[]) AS r(lo, hi)
CROSS JOIN LATERAL (
    SELECT e.id, e.status, e.last_error, e.locked_until
    FROM {schema}.outbox_events e
    WHERE e.id BETWEEN r.lo AND r.hi) e
UNION ALL
SELECT seen.last, false, false, false, NULL, seen.n
FROM seen
WHERE seen.last IS NOT NULL
UNION ALL
SELECT seen.first, false, false, false, $3::bigint, NULL
FROM seen
WHERE seen.first > $3::bigint + 1 AND seen.n = seen.last - seen.first + 1
UNION ALL
SELECT s.id, false, false, false, s.prev, NULL
FROM (SELECT p.id, lag(p.id, 1, $3::bigint) OVER (ORDER BY p.id) AS prev
      FROM (SELECT e.id
            FROM {schema}.outbox_events e
            WHERE $4::integer > 0 AND e.id > $3::bigint
            ORDER BY e.id
            LIMIT $4::integer) p) s
WHERE (SELECT seen.n < seen.last - seen.first + 1 FROM seen)
  AND s.id > s.prev + 1
