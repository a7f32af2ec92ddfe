-- How many PROCESSED events created before `cutoff_at` wait to be archived, for a dry run. Walks
-- the same rows as the archiving would (id order, stopping at the first young row), without
-- moving any; `batch_size` rows per call, as postbox_archive.
CREATE OR REPLACE FUNCTION {schema}.postbox_archive_count(cutoff_at timestamptz, after_id bigint, batch_size integer,
                                               OUT last_id bigint, OUT moved bigint,
                                               OUT done boolean)
LANGUAGE sql
STABLE
SET jit = off
AS $count$
WITH walk AS MATERIALIZED (
    SELECT e.id, e.status, e.created_at >= cutoff_at AS young
    FROM {schema}.outbox_events e
    WHERE e.id > after_id
    ORDER BY e.id
    LIMIT batch_size
), stop AS (
    SELECT min(id) AS id FROM walk WHERE young
), old AS (
    SELECT w.* FROM walk w, stop s WHERE s.id IS NULL OR w.id < s.id
)
SELECT coalesce((SELECT max(id) FROM old), after_id),
       (SELECT count(*) FROM old WHERE status = 'PROCESSED'),
       (SELECT id FROM stop) IS NOT NULL OR (SELECT count(*) FROM walk) < batch_size
$count$;
