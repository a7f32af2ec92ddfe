-- What a relay's claims passed over while a transaction held the commit horizon back (see
-- Store::claim_gaps): how far the first ? ids present after ? go (through the primary key):
-- the last one, with how many were read (n); the rows now in the ranges of ids it passed while
-- none was visible ({ranges}: `id BETWEEN ? AND ?` each, FALSE for none), each with whether it
-- is still to do and whether a claim may take it now; and, only when the ids read are fewer
-- than the ids they span, each id that ends a gap with the id present before it (prev, or the
-- id read after). The gaps are in flight, rolled back or removed: the relay keeps them, and
-- its floor and cursor go on past them. Answering the gaps, not every id present, keeps a read
-- of hundreds of thousands of ids to a few rows; and a read without a gap (most of them: a
-- history is dense) counts the ids, which costs a fraction of listing where the gaps are.
-- The read of the ids is written twice, not shared through a CTE of the ids: read by both, such
-- a CTE would be kept in memory, where the ids' order is lost and the gaps' window sorts them;
-- the second read is only asked for when the first found a gap.
WITH seen AS (
    SELECT COUNT(*) AS n, MAX(p.id) AS last
    FROM (SELECT id
          FROM outbox_events
          WHERE id > ?
          ORDER BY id
          LIMIT ?) p)
SELECT seen.last AS id, 0 AS passed, 0 AS unfinished, 0 AS claimable,
       CAST(NULL AS SIGNED) AS prev, CAST(seen.n AS SIGNED) AS n
FROM seen
WHERE seen.last IS NOT NULL
UNION ALL
SELECT id, 1,
       (status IN ('PENDING', 'PROCESSING') AND last_error IS NULL),
       (status IN ('PENDING', 'PROCESSING') AND last_error IS NULL
        AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6))),
       NULL, NULL
FROM outbox_events
WHERE {ranges}
UNION ALL
SELECT s.id, 0, 0, 0, s.prev, NULL
FROM (SELECT p.id, COALESCE(LAG(p.id) OVER (ORDER BY p.id), ?) AS prev
      FROM (SELECT id
            FROM outbox_events
            WHERE id > ?
            ORDER BY id
            LIMIT ?) p) s
WHERE (SELECT seen.n < seen.last - ? FROM seen)
  AND s.id > s.prev + 1
