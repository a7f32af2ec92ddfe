-- Archived events archived more than $1 seconds ago go: whole weeks by dropping their partitions,
-- then up to $2 rows of the rest; $3 a dry run (counts only). See
-- functions/postbox_archive_purge.sql.
SELECT purged, rest
FROM {schema}.postbox_archive_purge(now() - $1::float8 * interval '1 second', $2::integer,
                                    $3::boolean)
