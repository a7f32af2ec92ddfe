-- One batch of retention, first step: up to ?3 rows after id ?2 in id order, each with whether
-- it was created within the last ?1 seconds (the walk stops at the first such row: ids follow
-- creation, so the rest are younger) and whether it is PROCESSED. julianday() reads every date
-- form SQLite knows, so rows written by plain SQL count too.
SELECT id,
       julianday(created_at) >= julianday('now') - ?1 / 86400.0 AS young,
       status = 'PROCESSED' AS processed
FROM outbox_events
WHERE id > ?2
ORDER BY id
LIMIT ?3
