-- One batch of retention: PROCESSED events created more than $1 seconds ago (database clock)
-- move to the archive, walking ids after $2, $3 rows at most. See
-- functions/postbox_archive.sql.
SELECT last_id, moved, done
FROM {schema}.postbox_archive(now() - $1::float8 * interval '1 second', $2::bigint, $3::integer)
