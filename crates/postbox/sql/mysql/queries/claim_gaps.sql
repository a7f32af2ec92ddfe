-- What a relay's claims passed over while a transaction held the commit horizon back (see
-- Store::claim_gaps): the rows now in the ranges of ids it passed while none was visible
-- ({ranges}: `id BETWEEN ? AND ?` each, FALSE for none), each with whether it is still to do and
-- whether a claim may take it now; then the first ? ids present after ?, through the primary
-- key. The ranges missing between those are in flight, rolled back or removed: the relay keeps
-- them, and its floor and cursor go on past them.
SELECT id, 1 AS passed,
       (status IN ('PENDING', 'PROCESSING') AND last_error IS NULL) AS unfinished,
       (status IN ('PENDING', 'PROCESSING') AND last_error IS NULL
        AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6))) AS claimable
FROM outbox_events
WHERE {ranges}
UNION ALL
(SELECT id, 0, 0, 0
 FROM outbox_events
 WHERE id > ?
 ORDER BY id
 LIMIT ?)
